{{/*
The chart's name, or nameOverride. It is the app.kubernetes.io/name label,
which the ServiceMonitor turns into the job label the alert rules select.
*/}}
{{- define "forwarder.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: the release name, followed by the
chart name unless the release name already contains it. Truncated to 63
characters, the DNS label limit.
*/}}
{{- define "forwarder.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "forwarder.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "forwarder.labels" -}}
helm.sh/chart: {{ include "forwarder.chart" . }}
{{ include "forwarder.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: forwarder
{{- end }}

{{/* Labels that select the Deployment's pods: never change them in an upgrade. */}}
{{- define "forwarder.selectorLabels" -}}
app.kubernetes.io/name: {{ include "forwarder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "forwarder.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "forwarder.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository@digest, or repository:tag (appVersion by default). */}}
{{- define "forwarder.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the credentials: the operator's, or the chart's. */}}
{{- define "forwarder.secretName" -}}
{{- default (printf "%s-credentials" (include "forwarder.fullname" .)) .Values.secret.existingSecret }}
{{- end }}

{{/*
shutdownTimeout in whole seconds ("30s", "2m"), checked against the pod's
grace period: a kubelet that kills the process before its own shutdown
timeout leaves in-flight claims to expire instead of being released.
*/}}
{{- define "forwarder.shutdownSeconds" -}}
{{- $t := toString .Values.shutdownTimeout }}
{{- if regexMatch "^[0-9]+s$" $t }}
{{- trimSuffix "s" $t | int }}
{{- else if regexMatch "^[0-9]+m$" $t }}
{{- mul (trimSuffix "m" $t | int) 60 }}
{{- else }}
{{- fail (printf "shutdownTimeout %q: write it in whole seconds or minutes, like 30s or 2m" $t) }}
{{- end }}
{{- end }}

{{/*
The Secret holding one variable: secret.names' entry, else existingSecret,
else the chart's: the migration's and the console's database URLs in
Secrets of their own, so that who may read one need not read the others.
*/}}
{{- define "forwarder.secretNameFor" -}}
{{- $ctx := .ctx }}
{{- $own := index ($ctx.Values.secret.names | default dict) .name }}
{{- if $own }}
{{- $own }}
{{- else if $ctx.Values.secret.existingSecret }}
{{- $ctx.Values.secret.existingSecret }}
{{- else if eq .name "DATABASE_MIGRATE_URL" }}
{{- printf "%s-migration" (include "forwarder.fullname" $ctx) }}
{{- else if eq .name "CONSOLE_DATABASE_URL" }}
{{- printf "%s-console" (include "forwarder.fullname" $ctx) }}
{{- else }}
{{- include "forwarder.secretName" $ctx }}
{{- end }}
{{- end }}


{{/*
memory in MiB ("1Gi", "768Mi"): the one value the container's memory
request and limit and GOMEMLIMIT are made from (docs/configuration.md#memory).
*/}}
{{- define "forwarder.memoryMiB" -}}
{{- $m := toString .Values.memory }}
{{- if regexMatch "^[1-9][0-9]*Mi$" $m }}
{{- trimSuffix "Mi" $m | int }}
{{- else if regexMatch "^[1-9][0-9]*Gi$" $m }}
{{- mul (trimSuffix "Gi" $m | int) 1024 }}
{{- else }}
{{- fail (printf "memory %q: write it in Mi or Gi, like 1Gi or 768Mi" $m) }}
{{- end }}
{{- end }}

{{/*
GOMEMLIMIT, Go's soft memory limit: 70 % of memory. The limit is soft: with
16 MiB messages the resident size runs up to about 160 MiB past it, and the
rest is stacks, the runtime and what the collector has not yet returned
(docs/configuration.md#memory).
*/}}
{{- define "forwarder.goMemLimit" -}}
{{- printf "%dMiB" (div (mul (include "forwarder.memoryMiB" . | int) 7) 10) }}
{{- end }}


{{/* The environment from the Secrets, shared by the service and the migration Job. */}}
{{- define "forwarder.secretEnv" -}}
{{- $ctx := .ctx }}
{{- range $name := .names }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "forwarder.secretNameFor" (dict "ctx" $ctx "name" $name) }}
      key: {{ index $ctx.Values.secret.keys $name | default $name }}
      {{- if has $name (list "KAFKA_SASL_PASSWORD" "CONSOLE_TOKEN") }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}

{{/* The service's database variables: DATABASE_URL, and those database: turns on. */}}
{{- define "forwarder.serviceDatabaseVars" -}}
{{- $vars := list "DATABASE_URL" }}
{{- if .Values.database.directURL }}{{ $vars = append $vars "DATABASE_DIRECT_URL" }}{{ end }}
{{- if .Values.database.consoleRole }}{{ $vars = append $vars "CONSOLE_DATABASE_URL" }}{{ end }}
{{- join "," $vars }}
{{- end }}

{{/* The migration Job's: the owner's URL, or the service's (and its direct one). */}}
{{- define "forwarder.migrationDatabaseVars" -}}
{{- if .Values.database.migrationRole }}
{{- "DATABASE_MIGRATE_URL" }}
{{- else if .Values.database.directURL }}
{{- "DATABASE_URL,DATABASE_DIRECT_URL" }}
{{- else }}
{{- "DATABASE_URL" }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the Deployment and the migration Job. */}}
{{- define "forwarder.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}
