package envelope

import (
	"slices"
	"strings"
)

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

// Policy decides what delayd may do on a publisher's behalf: which targets
// it publishes to, and which NATS control headers it passes through.
//
// A target is checked in this order:
//  1. the built-in deny (BuiltinDeny): system subjects, reply spaces and
//     delayd's own; it cannot be switched off, but a $-subject may be
//     opened by an explicit allow (below);
//  2. the allow list, if not empty: the target must match one pattern. An
//     allow pattern opens a $-subject only when it names that subject's
//     first token literally ("$KV.orders.>" opens $KV.orders.x; ">" or
//     "*.>" never opens a $-subject);
//  3. the user's deny list, which wins over the allow list.
type Policy struct {
	// Prefix is delayd's own subject prefix, denied so that a delayed
	// message to <prefix>.schedule cannot loop.
	Prefix string
	Allow  []string
	Deny   []string
	// AllowNATS lists the Nats-* headers a publisher may pass through
	// (matched case-insensitively); every other Nats-* header is refused.
	AllowNATS []string
}

// Rule is one built-in deny rule, named in the 403 that it causes.
type Rule struct {
	Name string // as shown to users: "$*", "_INBOX.>", ...
	Why  string
	// openable: an explicit targets.allow pattern may lift it.
	openable bool
	match    func(first, subject string) bool
}

// BuiltinDeny lists the subject spaces delayd never publishes to on its
// own: anything whose first token starts with "$" (the server's and its
// subsystems' APIs and state: $SYS, $JS, $JSC, $KV, $O, $SRV, $MQTT, $NRG,
// $G, and whatever NATS adds next), reply inboxes, service-import replies,
// and delayd's own subjects. Tokens are compared case-insensitively: the
// rules cover spellings a client library might normalise.
func BuiltinDeny(prefix string) []Rule {
	return append(slices.Clone(fixedDeny), ownDeny(prefix))
}

// fixedDeny are the built-in rules that do not depend on the prefix: built
// once, as Check runs for every request.
var fixedDeny = []Rule{
	{Name: "$*", Why: "NATS system subjects", openable: true,
		match: func(first, _ string) bool { return strings.HasPrefix(first, "$") }},
	// Custom inbox prefixes (_INBOX_orders, per user) are inboxes too.
	{Name: "_INBOX*.>", Why: "reply inboxes",
		match: func(first, _ string) bool { return HasPrefixFold(first, "_INBOX") }},
	{Name: "_R_.>", Why: "service-import replies",
		match: func(first, _ string) bool { return strings.EqualFold(first, "_R_") }},
}

// refuse is the 403 of a target that rule r refuses.
func (r Rule) refuse(target string) error {
	return reject(CodeForbidden, "target %s is refused by the built-in rule %s (%s)", Quote(target), r.Name, r.Why)
}

// ownDeny is the rule for delayd's own subjects under prefix.
func ownDeny(prefix string) Rule {
	return Rule{Name: prefix + ".>", Why: "delayd's own subjects",
		match: func(_, s string) bool { return ownSubject(prefix, s) }}
}

// ownSubject reports whether s is prefix or under it, in any case.
func ownSubject(prefix, s string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) &&
		(len(s) == len(prefix) || s[len(prefix)] == '.')
}

// Check returns nil if target may be published to under the policy, else
// a 403 *Error naming the rule that refused it.
func (p Policy) Check(target string) error {
	first, _, _ := strings.Cut(target, ".")
	for _, r := range fixedDeny {
		if r.match(first, target) && !(r.openable && p.opens(first, target)) {
			return r.refuse(target)
		}
	}
	if ownSubject(p.Prefix, target) {
		return ownDeny(p.Prefix).refuse(target)
	}
	if len(p.Allow) > 0 && !p.allowed(target) {
		return reject(CodeForbidden, "target %s matches no targets.allow pattern", Quote(target))
	}
	for _, d := range p.Deny {
		if Match(d, target) {
			return reject(CodeForbidden, "target %s is refused by targets.deny %q", Quote(target), d)
		}
	}
	return nil
}

// Allowed reports whether target may be published to under the policy.
func (p Policy) Allowed(target string) bool { return p.Check(target) == nil }

func (p Policy) allowed(target string) bool {
	for _, a := range p.Allow {
		if Match(a, target) {
			return true
		}
	}
	return false
}

// opens reports whether an allow pattern names target's first token
// literally and matches it: only such an explicit pattern lifts a
// built-in rule.
func (p Policy) opens(first, target string) bool {
	for _, a := range p.Allow {
		if af, _, _ := strings.Cut(a, "."); af == first && Match(a, target) {
			return true
		}
	}
	return false
}

// MatchAny reports whether subject matches one of the patterns.
func MatchAny(patterns []string, subject string) bool {
	for _, p := range patterns {
		if Match(p, subject) {
			return true
		}
	}
	return false
}
