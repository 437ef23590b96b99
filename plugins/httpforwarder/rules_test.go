package httpforwarder

import (
	"encoding/json"
	"strings"
	"testing"
)

func envOf(t *testing.T, status int, body string) *ruleEnv {
	t.Helper()
	env := &ruleEnv{Status: status, Headers: map[string]string{}}
	if body != "" {
		if err := json.Unmarshal([]byte(body), &env.Body); err != nil {
			t.Fatalf("test body %s: %v", body, err)
		}
	}
	return env
}

func TestDefaultRules(t *testing.T) {
	t.Parallel()
	rs, err := compileRules(defaultRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		env    *ruleEnv
		want   string
		errMsg string
	}{
		{name: "Result0", env: envOf(t, 200, `{"result":0}`), want: outcomeSuccess},
		{name: "Result0String", env: envOf(t, 200, `{"result":"0"}`), want: outcomeSuccess},
		{name: "Result0Created", env: envOf(t, 201, `{"result":0,"errcode":"0"}`), want: outcomeSuccess},
		{name: "Errcode4String", env: envOf(t, 200, `{"result":1,"errcode":"4"}`), want: outcomeDuplicate},
		{name: "Errcode4Number", env: envOf(t, 200, `{"result":1,"errcode":4}`), want: outcomeDuplicate},
		{name: "Errcode4WinsOverResult0", env: envOf(t, 200, `{"result":0,"errcode":"4"}`), want: outcomeDuplicate},
		{name: "Errcode998", env: envOf(t, 200, `{"result":1,"errcode":"998"}`), want: outcomeNoRetry},
		{name: "Errcode998Number", env: envOf(t, 200, `{"result":1,"errcode":998}`), want: outcomeNoRetry},
		{name: "Errcode999", env: envOf(t, 200, `{"result":1,"errcode":"999"}`), want: outcomeRetry},
		{name: "Result1NoErrcode", env: envOf(t, 200, `{"result":1}`), want: outcomeRetry},
		{name: "ResultMissing", env: envOf(t, 200, `{"errcode":"0"}`), want: outcomeRetry},
		{name: "Errcode40IsNot4", env: envOf(t, 200, `{"result":1,"errcode":"40"}`), want: outcomeRetry},
		{name: "NotJSON", env: envOf(t, 200, ``), want: outcomeRetry},
		{name: "JSONArray", env: envOf(t, 200, `[{"result":0}]`), want: outcomeRetry},
		{name: "JSONString", env: envOf(t, 200, `"result"`), want: outcomeRetry},
		{name: "JSONNull", env: envOf(t, 200, `null`), want: outcomeRetry},
		{name: "Status500WithResult0", env: envOf(t, 500, `{"result":0}`), want: outcomeRetry},
		{name: "Status404WithErrcode998", env: envOf(t, 404, `{"errcode":"998"}`), want: outcomeRetry},
		{name: "TransportError", env: &ruleEnv{Error: "connection refused"}, want: outcomeRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _, _ := rs.classify(tc.env)
			if got.Outcome != tc.want {
				t.Fatalf("outcome %s, want %s", got.Outcome, tc.want)
			}
		})
	}
}

func TestCompileRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec ruleSpec
		want string // error text; "" for none
	}{
		{name: "Valid", spec: ruleSpec{When: `status == 200 && headers["X-Code"] == "1" && error == ""`, Outcome: outcomeSuccess}},
		{name: "SyntaxError", spec: ruleSpec{When: `status >`, Outcome: outcomeNoRetry},
			want: `rules[0] (no_retry): when "status >" does not compile: unexpected token EOF (1:8)`},
		{name: "NotBoolean", spec: ruleSpec{When: `status + 1`, Outcome: outcomeRetry},
			want: `rules[0] (retry): when "status + 1" does not compile: expected bool, but got int`},
		{name: "UnknownVariable", spec: ruleSpec{When: `stauts == 200`, Outcome: outcomeSuccess},
			want: `rules[0] (success): when "stauts == 200" does not compile: unknown name stauts (1:1)`},
		{name: "TypeMismatch", spec: ruleSpec{When: `status == "200"`, Outcome: outcomeSuccess},
			want: `does not compile: invalid operation: == (mismatched types int and string)`},
		{name: "Empty", spec: ruleSpec{When: "  ", Outcome: outcomeSuccess}, want: "rules[0] (success): when is empty"},
		{name: "BadOutcome", spec: ruleSpec{When: "true", Outcome: "maybe"},
			want: `rules[0]: outcome "maybe" is not one of success, duplicate, no_retry, retry`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := compileRule(0, tc.spec)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestRuleRunErrorDoesNotMatch(t *testing.T) {
	t.Parallel()
	rs, err := compileRules([]ruleSpec{
		{When: `body.code == "OK"`, Outcome: outcomeSuccess}, // fails on a nil body
		{When: `status == 200`, Outcome: outcomeDuplicate},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, idx, runErr := rs.classify(envOf(t, 200, ""))
	if got.Outcome != outcomeDuplicate || idx != 1 || runErr == nil || !strings.HasPrefix(runErr.Error(), "rules[0]: ") {
		t.Fatalf("classify = %s, %d, %v; want duplicate by rules[1] and rules[0]'s run error", got.Outcome, idx, runErr)
	}
}

// TestCustomRulesFromYAML: rules set in the config replace the defaults.
func TestCustomRulesFromYAML(t *testing.T) {
	t.Parallel()
	out := newTestOutput(t, baseYAML("postgres://localhost:1/none", "http://127.0.0.1:1", `
rules:
  - when: 'status == 200 && body?.code == "OK"'
    outcome: success
  - when: 'status == 409'
    outcome: duplicate
  - when: 'status in [400, 422] || headers["X-Reject"] == "yes"'
    outcome: no_retry
`), nil)
	for _, tc := range []struct {
		env  *ruleEnv
		want string
	}{
		{envOf(t, 200, `{"code":"OK"}`), outcomeSuccess},
		{envOf(t, 200, `{"result":0}`), outcomeRetry}, // a default success no longer is one
		{envOf(t, 409, ``), outcomeDuplicate},
		{envOf(t, 422, `{}`), outcomeNoRetry},
		{&ruleEnv{Status: 500, Headers: map[string]string{"X-Reject": "yes"}}, outcomeNoRetry},
	} {
		if got, _, _ := out.policy.rules.classify(tc.env); got.Outcome != tc.want {
			t.Errorf("status %d body %v headers %v: %s, want %s", tc.env.Status, tc.env.Body, tc.env.Headers, got.Outcome, tc.want)
		}
	}
}

func TestRulesCopyHeadersOnlyWhenRead(t *testing.T) {
	t.Parallel()
	defaults, err := compileRules(defaultRules)
	if err != nil {
		t.Fatal(err)
	}
	custom, err := compileRules([]ruleSpec{{When: `status == 200`, Outcome: outcomeSuccess}, {When: `"a" in headers`, Outcome: outcomeRetry}})
	if err != nil {
		t.Fatal(err)
	}
	viaEnv, err := compileRules([]ruleSpec{{When: `$env["headers"]["X-Code"] == "1"`, Outcome: outcomeSuccess}})
	if err != nil {
		t.Fatal(err)
	}
	if defaults.usesHeaders || !custom.usesHeaders || !viaEnv.usesHeaders {
		t.Fatalf("usesHeaders: defaults %v, custom %v, via $env %v; want false, true, true",
			defaults.usesHeaders, custom.usesHeaders, viaEnv.usesHeaders)
	}
	env := &ruleEnv{Status: 200, Headers: map[string]string{"X-Code": "1"}}
	if got, _, err := viaEnv.classify(env); got.Outcome != outcomeSuccess {
		t.Fatalf("rule via $env: %s (%v)", got.Outcome, err)
	}
}
