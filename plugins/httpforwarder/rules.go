package httpforwarder

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"
	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

// Outcomes a rule can give to a platform response (docs/configuration.md#platform-responses).
const (
	outcomeSuccess   = "success"   // delivered: SUCCESS
	outcomeDuplicate = "duplicate" // delivered before: SUCCESS
	outcomeNoRetry   = "no_retry"  // rejected for good: FAILED
	outcomeRetry     = "retry"     // transient: PENDING, or FAILED at max_attempts
)

var outcomes = []string{outcomeSuccess, outcomeDuplicate, outcomeNoRetry, outcomeRetry}

// defaultRules implement the platform's documented replies (docs/configuration.md#platform-responses). The first matching rule wins; a
// response no rule matches is retried.
var defaultRules = []ruleSpec{
	{When: `status >= 200 && status < 300 && body?.errcode in ["4", 4]`, Outcome: outcomeDuplicate},
	{When: `status >= 200 && status < 300 && body?.errcode in ["998", 998]`, Outcome: outcomeNoRetry},
	{When: `status >= 200 && status < 300 && body?.result in [0, "0"]`, Outcome: outcomeSuccess},
}

// ruleEnv is what a rule's `when` expression sees.
type ruleEnv struct {
	// Status is the HTTP status, 0 when no response came.
	Status int `expr:"status"`
	// Headers holds the response headers by canonical name, first value.
	Headers map[string]string `expr:"headers"`
	// Body is the response body parsed as JSON, nil when it is not JSON.
	Body any `expr:"body"`
	// Error is the transport error (timeout, refused connection, ...), ""
	// when a response came.
	Error string `expr:"error"`
}

type ruleSpec struct {
	When    string
	Outcome string
	// MessageSpecific says a matching reply concerns its message alone:
	// whatever its status it shows the platform up.
	MessageSpecific bool
}

type rule struct {
	ruleSpec
	program *vm.Program
}

// ruleSet is an ordered list of compiled rules.
type ruleSet struct {
	rules []rule
	// usesHeaders says a rule reads `headers`; otherwise the reply's
	// headers are not copied for it.
	usesHeaders bool
}

// vmPool recycles expr VMs: classifying a reply runs several programs.
var vmPool = sync.Pool{New: func() any { return new(vm.VM) }}

// compileRule compiles one rule; its errors name the rule by index and quote
// the expression, for the constructor and for `forwarder lint` alike.
func compileRule(i int, spec ruleSpec) (rule, error) {
	p, err := compileWhen(i, spec)
	if err != nil {
		return rule{}, err
	}
	if !isOutcome(spec.Outcome) {
		return rule{}, fmt.Errorf("rules[%d]: outcome %q is not one of %s", i, spec.Outcome, strings.Join(outcomes, ", "))
	}
	return rule{ruleSpec: spec, program: p}, nil
}

func compileWhen(i int, spec ruleSpec) (*vm.Program, error) {
	if strings.TrimSpace(spec.When) == "" {
		return nil, fmt.Errorf("rules[%d] (%s): when is empty", i, spec.Outcome)
	}
	p, err := expr.Compile(spec.When, expr.Env(ruleEnv{}), expr.AsBool())
	if err != nil {
		return nil, fmt.Errorf("rules[%d] (%s): when %q does not compile: %s", i, spec.Outcome, spec.When, exprErrorText(err))
	}
	return p, nil
}

func compileRules(specs []ruleSpec) (ruleSet, error) {
	rs := ruleSet{rules: make([]rule, 0, len(specs))}
	var errs []error
	for i, s := range specs {
		r, err := compileRule(i, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rs.rules = append(rs.rules, r)
		rs.usesHeaders = rs.usesHeaders || readsName(r.program, "headers") || readsName(r.program, "$env")
	}
	if len(errs) > 0 {
		return ruleSet{}, errors.Join(errs...)
	}
	return rs, nil
}

// readsName says whether a program refers to a variable of env.
func readsName(p *vm.Program, name string) bool {
	v := &nameFinder{name: name}
	node := p.Node()
	ast.Walk(&node, v)
	return v.found
}

type nameFinder struct {
	name  string
	found bool
}

func (f *nameFinder) Visit(node *ast.Node) {
	if id, ok := (*node).(*ast.IdentifierNode); ok && id.Value == f.name {
		f.found = true
	}
}

// classify returns the first rule that matches env, and its index; a retry
// rule and -1 when none does. A rule that fails at run time (say
// `body.result` on a nil body) does not match; the first such error is
// returned for debugging.
func (rs ruleSet) classify(env *ruleEnv) (matched ruleSpec, index int, runErr error) {
	machine := vmPool.Get().(*vm.VM)
	defer vmPool.Put(machine)
	for i, r := range rs.rules {
		out, err := machine.Run(r.program, env)
		if err != nil {
			if runErr == nil {
				runErr = fmt.Errorf("rules[%d]: %s", i, exprErrorText(err))
			}
			continue
		}
		if ok, _ := out.(bool); ok {
			return r.ruleSpec, i, runErr
		}
	}
	return ruleSpec{Outcome: outcomeRetry}, -1, runErr
}

func isOutcome(s string) bool {
	for _, o := range outcomes {
		if s == o {
			return true
		}
	}
	return false
}

// exprErrorText puts an expr error on one line: "message (line:column)".
func exprErrorText(err error) string {
	var fe *file.Error
	if errors.As(err, &fe) {
		if fe.Line > 0 {
			return fmt.Sprintf("%s (%d:%d)", fe.Message, fe.Line, fe.Column+1)
		}
		return fe.Message
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Bloblang methods through which the spec's lint rules run Go checks, so
// that `forwarder lint` reports a bad expression or lease exactly as start-up
// would: Benthos lint never runs constructors, and lint rules can only be
// Bloblang. Only core Bloblang may appear next to them in a rule: plugin
// methods (parse_duration, ...) may be registered after this package's init.
const (
	ruleLintMethod  = "http_forwarder_rule_lints"
	leaseLintMethod = "http_forwarder_lease_lints"
)

// rulesLintRule is the `rules` field's lint rule. Benthos runs it on the
// whole list and again on each element; only the list is linted, so that a
// rule's index can be named.
const rulesLintRule = `root = if this.type() == "array" { this.` + ruleLintMethod + `() }`

// leaseLintRule is the component's lint rule for timeout < lease.
const leaseLintRule = `root = if this.type() == "object" { this.` + leaseLintMethod + `() }`

func registerLintMethods() error {
	for name, fn := range map[string]func(any) []any{ruleLintMethod: lintRules, leaseLintMethod: lintLease} {
		spec := bloblang.NewPluginSpec().
			Category("Object & Array Manipulation").
			Description("Used by the lint rules of the http_forwarder output; returns its lint messages.")
		err := bloblang.RegisterMethodV2(name, spec, func(*bloblang.ParsedParams) (bloblang.Method, error) {
			return func(v any) (any, error) { return fn(v), nil }, nil
		})
		if err != nil {
			return fmt.Errorf("registering bloblang method %s: %w", name, err)
		}
	}
	return nil
}

// lintLease checks an http_forwarder config object: timeout < lease.
// Unparseable durations are left to the constructor.
func lintLease(v any) []any {
	conf, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	leaseStr, _ := conf[hfFieldLease].(string)
	if leaseStr == "" {
		return nil
	}
	timeoutStr, ok := conf[hfFieldTimeout].(string)
	if !ok {
		timeoutStr = defaultTimeout
	}
	lease, err1 := time.ParseDuration(leaseStr)
	timeout, err2 := time.ParseDuration(timeoutStr)
	if err1 != nil || err2 != nil {
		return nil
	}
	if err := leaseError(timeout, lease); err != nil {
		return []any{err.Error()}
	}
	return nil
}

// lintRules compiles a config's `rules` value. Elements of the wrong shape
// are left to Benthos's own type lints.
func lintRules(v any) []any {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	lints := []any{}
	for i, e := range list {
		obj, ok := e.(map[string]any)
		if !ok {
			continue
		}
		when, ok := obj[hfFieldRuleWhen].(string)
		if !ok {
			continue
		}
		outcome, _ := obj[hfFieldRuleOutcome].(string)
		spec := ruleSpec{When: when, Outcome: outcome}
		var err error
		if isOutcome(strings.ToLower(outcome)) {
			// Benthos's enum lint ignores case; start-up does not.
			_, err = compileRule(i, spec)
		} else {
			// The field's enum lint reports the outcome.
			_, err = compileWhen(i, spec)
		}
		if err != nil {
			lints = append(lints, err.Error())
		}
	}
	return lints
}
