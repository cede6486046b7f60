package tlsvalidation

import (
	"fmt"
	"time"
)

// validAt reports whether one of the bundle's certificates is valid at t:
// RFC 5280 §4.1.2.5's validity period includes NotBefore and NotAfter.
func (p *parsedBundle) validAt(t time.Time) bool {
	for _, c := range p.certs {
		if !t.Before(c.NotBefore) && !t.After(c.NotAfter) {
			return true
		}
	}
	return false
}

// outsideValidity says, when none of the bundle's certificates is valid at
// now, when one was or will be ("" when one is). It never names now, so
// that the message stays the same from one translation to the next.
func (p *parsedBundle) outsideValidity(now time.Time) string {
	if p.validAt(now) {
		return ""
	}
	const fix = "; put a currently valid CA certificate there"
	var next, last time.Time
	for _, c := range p.certs {
		if c.NotBefore.After(now) {
			next = earliest(next, c.NotBefore)
		} else if c.NotAfter.After(last) {
			last = c.NotAfter
		}
	}
	if len(p.certs) == 1 {
		c := p.certs[0]
		if !next.IsZero() {
			return fmt.Sprintf("the certificate in %s (%s) is not valid before %s%s", CAKey, c.Subject, stamp(next), fix)
		}
		return fmt.Sprintf("the certificate in %s (%s) expired at %s%s", CAKey, c.Subject, stamp(last), fix)
	}
	if !next.IsZero() {
		return fmt.Sprintf("none of the %d certificates in %s is valid now; the next becomes valid at %s%s", len(p.certs), CAKey, stamp(next), fix)
	}
	return fmt.Sprintf("all %d certificates in %s have expired, the last at %s%s", len(p.certs), CAKey, stamp(last), fix)
}

// validityChangesAfter returns the first instant after now at which
// validAt changes, zero when it never does: the first NotBefore to come
// while no certificate is valid, else the nanosecond after the end of the
// run of overlapping or adjoining validity periods now is in.
func (p *parsedBundle) validityChangesAfter(now time.Time) time.Time {
	if !p.validAt(now) {
		var next time.Time
		for _, c := range p.certs {
			if c.NotBefore.After(now) {
				next = earliest(next, c.NotBefore)
			}
		}
		return next
	}
	// One pass over the periods by start: once one starts after end (and
	// the instant after it), so do all the rest, and end is final.
	end := now
	for _, c := range p.byStart {
		if c.NotBefore.After(end.Add(time.Nanosecond)) {
			break
		}
		if c.NotAfter.After(end) {
			end = c.NotAfter
		}
	}
	return end.Add(time.Nanosecond)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
