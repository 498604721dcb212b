package envelope

import "strings"

// ValidTarget reports whether s is a literal NATS subject a message can be
// published to: dot-separated non-empty tokens, no wildcards, no whitespace.
func ValidTarget(s string) bool {
	if s == "" || len(s) > 1024 {
		return false
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			c := s[i]
			switch {
			case c == '*' || c == '>':
				return false
			case c <= ' ' || c == 0x7f:
				return false
			case c != '.':
				continue
			}
		}
		if i == start {
			return false // empty token: leading, trailing or double dot
		}
		start = i + 1
	}
	return true
}

// ValidPattern reports whether p is a NATS subject pattern: tokens may be
// '*', and a final token may be '>'.
func ValidPattern(p string) bool {
	if p == "" {
		return false
	}
	toks := strings.Split(p, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return false
		case t == ">" && i != len(toks)-1:
			return false
		case t == "*" || t == ">":
		case strings.ContainsAny(t, "*> \t\r\n"):
			return false
		}
	}
	return true
}

// Match reports whether the literal subject matches the pattern, with the NATS
// meaning of '*' (one token) and '>' (one or more trailing tokens).
func Match(pattern, subject string) bool {
	for {
		pt, prest, pmore := strings.Cut(pattern, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case pt == ">":
			return st != ""
		case pt != "*" && pt != st:
			return false
		}
		if !pmore || !smore {
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

// Policy decides which targets delayd may publish to on a caller's behalf.
// Deny wins over allow; an empty allow list allows everything not denied.
type Policy struct {
	Allow []string
	Deny  []string
}

// DefaultDeny lists the subject spaces delayd never publishes to: the
// server's and JetStream's APIs, reply inboxes, and delayd's own subjects
// (a delayed message to delayd.schedule would loop forever).
func DefaultDeny(prefix string) []string {
	return []string{"$SYS.>", "$JS.>", "$KV.>", "$O.>", "$SRV.>", "_INBOX.>", prefix + ".>"}
}

// Allowed reports whether target may be published to under the policy.
func (p Policy) Allowed(target string) bool {
	for _, d := range p.Deny {
		if Match(d, target) {
			return false
		}
	}
	if len(p.Allow) == 0 {
		return true
	}
	for _, a := range p.Allow {
		if Match(a, target) {
			return true
		}
	}
	return false
}
