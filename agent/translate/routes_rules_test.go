package translate

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestSegmentRegex: an expression placed in the path expression
// "/service/method" by segmentRegex, as the service or as the method,
// matches exactly the values the expression matches as a whole value,
// anchors included, and only when they hold no "/": neither side reaches
// into the other or across more segments. An anchor it cannot place is
// refused, and so is an expression that matches only values with a "/",
// however the "/" is spelt or the parser folds it: alone, escaped, in a
// class of its own or an alternation Go merges into a class with others
// (the forms that matched nothing else are refused; the ones that do keep
// what else they match, like classes that span "/"). One that matches
// nothing at all, needing a character of an empty class, is refused
// naming that, even beside a "/". An expression that needs no rewrite is
// kept as written.
func TestSegmentRegex(t *testing.T) {
	values := []string{"", "a", "A", "b", "y", "xy", "xxy", "ac", "bc", "ab", "foo", "foo.Bar", "pkg.foo", "a\nb",
		"/", "a/", "/a", "a/b", "foo.Svc/Extra", "foo/Bar", "pkg.foo/M", "M/M", "a/\nb"}
	const (
		slash   = `matches only values with a "/"`
		anchor  = "has an anchor"
		nothing = "matches nothing at all"
	)
	for _, tc := range []struct {
		expr string
		// refused is what the refusal names; "" when the expression is kept.
		refused string
	}{
		{expr: `^a$`},
		{expr: `\Aa\z`},
		{expr: `(?m)^a$`},
		{expr: `(?i)^a$|^b`},
		{expr: `(^a|b)c$`},
		{expr: `^(?:foo|pkg)\..*$`},
		{expr: `^$`},
		{expr: `\bfoo\b`},
		{expr: `foo.*`},
		{expr: `.*`},
		{expr: `(?s).+`},
		{expr: `[^.]*`},
		{expr: `\W?[[:punct:]]?\PL*`},
		{expr: `[!-0]+`},
		{expr: `[.-0]`},  // a range spanning "/"
		{expr: `\W+`},    // a class naming none
		{expr: `[^a]`},   // nor a negated one
		{expr: `[/]|a`},  // parsed as one class, [/a]
		{expr: `a|\x2f`}, // [/a] too
		{expr: `[a/]`},
		{expr: `(?i)A|/`}, // [/Aa]
		{expr: `ab|a/`},   // a[/b]
		{expr: `ab|\x2f`}, // ab|/
		{expr: `a/?b`},
		{expr: `a(?:/b)*`},
		{expr: `a|(?:b/)+`},
		{expr: `/{0,2}a`},
		{expr: `foo\/Bar`, refused: slash},
		{expr: `[/]`, refused: slash},
		{expr: `[\x2f]`, refused: slash},
		{expr: `\x{2F}|\057`, refused: slash},
		{expr: `(?i)/`, refused: slash},
		{expr: `\Q/\E`, refused: slash},
		{expr: `^/$`, refused: slash},
		{expr: `a/|/b`, refused: slash},
		{expr: `[^\x00-.0-\x{10FFFF}]`, refused: slash}, // a class of "/" alone
		{expr: `(?s).*/.*`, refused: slash},
		{expr: `(a/){1,}`, refused: slash},
		// Matching nothing at all, with or without a "/": said so, not
		// blamed on the "/".
		{expr: `[^\s\S]`, refused: nothing},
		{expr: `\P{Any}`, refused: nothing},
		{expr: `^[^\D\d]$`, refused: nothing},
		{expr: `a[^\s\S]`, refused: nothing},
		{expr: `(?:b|[^\s\S])[^\s\S]+`, refused: nothing},
		{expr: `[^\s\S]{2,}|a(?:[^\s\S])`, refused: nothing},
		{expr: `\P{Any}/Get`, refused: nothing},
		{expr: `/[^\s\S]|(?s).[^\s\S]`, refused: nothing},
		{expr: `[^\s\S]|a/`, refused: slash}, // the branch that can match needs a "/"
		{expr: `a|[^\s\S]`},                  // a branch matches "a"
		{expr: `a[^\s\S]*`},                  // none of the empty class: "a"
		{expr: `(?:.[^\s\S])?a`},
		{expr: `x*^y`, refused: anchor},
		{expr: `(^a)*`, refused: anchor},
		{expr: `a$b`, refused: anchor},
	} {
		got, problem := segmentRegex(tc.expr)
		if (problem == "") != (tc.refused == "") || !strings.Contains(problem, tc.refused) {
			t.Errorf("segmentRegex(%q) = %q, %q; want it refused naming %q (\"\": kept)", tc.expr, got, problem, tc.refused)
			continue
		}
		if tc.refused != "" {
			continue
		}
		whole := regexp.MustCompile("^(?:" + tc.expr + ")$")
		asService := regexp.MustCompile("^(?:/(?:" + got + ")/(?:M))$")
		asMethod := regexp.MustCompile("^(?:/[^/]+/(?:" + got + "))$")
		for _, v := range values {
			want := whole.MatchString(v) && !strings.Contains(v, "/")
			if inPath := asService.MatchString("/" + v + "/M"); inPath != want {
				t.Errorf("segmentRegex(%q) = %q: service %q matches %v in the path, want %v", tc.expr, got, v, inPath, want)
			}
			if inPath := asMethod.MatchString("/S/" + v); inPath != want {
				t.Errorf("segmentRegex(%q) = %q: method %q matches %v in the path, want %v", tc.expr, got, v, inPath, want)
			}
		}
	}
	for _, expr := range []string{`grpc\.reflection\.[a-z]+`, `(Check|Watch)`} {
		if got, _ := segmentRegex(expr); got != expr {
			t.Errorf("segmentRegex(%q) = %q, want it as written", expr, got)
		}
	}
}

// TestRegexChars: an expression's characters, as precedence counts them,
// leave out its anchors only: spellings of one meaning with and without
// them count alike, and a "^" or "$" that is a character, a class's
// negation or inside a class, quoted or escaped, counts.
func TestRegexChars(t *testing.T) {
	for expr, want := range map[string]int{
		`foo`: 3, `^foo$`: 3, `\Afoo\z`: 3, `(?m)^foo$`: 7, `^a$|^b$`: 3, `(^a|b)c$`: 6, `^$`: 0,
		`[^/]+`: 5, `[$^]`: 4, `[]^]`: 4, `[^]$]`: 5, `[[:^alpha:]]`: 12, `[[:^alpha:]^]$`: 13,
		`\^\$`: 4, `\\$`: 2, `[\]^]`: 5, `\Q^$\E`: 6, `\Q^$`: 4, `\p{^Greek}$`: 10, `\pL^`: 3, `x\`: 2,
	} {
		if got := regexChars(expr); got != want {
			t.Errorf("regexChars(%q) = %d, want %d", expr, got, want)
		}
	}
}

// TestRuleProblemsPerPort: a failing rule's answer is told for the ports
// its route governs on the parent, not those it lost to routes of the
// other kind, where its requests never meet it (gamma/grpc-unaccepted has
// every port lost). Before, every parent's message said requests got the
// rule's answer.
func TestRuleProblemsPerPort(t *testing.T) {
	const failing = "rule 0: unsupported"
	for _, tc := range []struct {
		ports, conflicted []int32
		want              string
	}{
		{ports: []int32{80, 81}, want: failing + " (requests the rule matches get HTTP 500: sockmesh never routes a rule without all it asks for)"},
		{ports: []int32{80, 81}, conflicted: []int32{80}, want: failing + " (requests the rule matches on port(s) 81 get HTTP 500: sockmesh never routes a rule without all it asks for)"},
		{ports: []int32{80, 81}, conflicted: []int32{80, 81}, want: failing},
	} {
		e := &routeEval{kind: snapshot.KindHTTPRoute, failing: []string{failing}}
		po := &parentOutcome{ports: tc.ports, conflicted: tc.conflicted}
		if got := ruleProblems(e, po); !slices.Equal(got, []string{tc.want}) {
			t.Errorf("ruleProblems with ports %v, %v lost = %q, want %q", tc.ports, tc.conflicted, got, tc.want)
		}
	}
}
