package translate

import (
	"regexp"
	"testing"
)

// TestSegmentRegex: a service expression placed in the path expression
// "/service/method" by segmentRegex matches exactly the services the
// expression matches as a whole value, anchors included; an anchor it
// cannot place is refused, and an expression without anchors is kept as
// written.
func TestSegmentRegex(t *testing.T) {
	services := []string{"", "a", "A", "b", "y", "xy", "xxy", "ac", "bc", "ab", "foo", "foo.Bar", "pkg.foo", "a\nb"}
	for _, tc := range []struct {
		expr    string
		refused bool
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
		{expr: `x*^y`, refused: true},
		{expr: `(^a)*`, refused: true},
		{expr: `a$b`, refused: true},
	} {
		got, problem := segmentRegex(tc.expr)
		if refused := problem != ""; refused != tc.refused {
			t.Errorf("segmentRegex(%q) = %q, %q; refused %v, want %v", tc.expr, got, problem, refused, tc.refused)
			continue
		}
		if tc.refused {
			continue
		}
		whole := regexp.MustCompile("^(?:" + tc.expr + ")$")
		path := regexp.MustCompile("^(?:/(?:" + got + ")/(?:M))$")
		for _, s := range services {
			if want, inPath := whole.MatchString(s), path.MatchString("/"+s+"/M"); inPath != want {
				t.Errorf("segmentRegex(%q) = %q: service %q matches %v in the path, %v alone", tc.expr, got, s, inPath, want)
			}
		}
	}
	if got, _ := segmentRegex(`grpc\.reflection\..*`); got != `grpc\.reflection\..*` {
		t.Errorf("segmentRegex without anchors = %q, want it as written", got)
	}
}
