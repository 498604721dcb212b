package bridge

import (
	"regexp"
	"strings"
)

// semVer is the form NATS micro requires of a service's version: SemVer
// 2.0 without a leading "v" (the expression micro's own check uses).
var semVer = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// ServiceVersion maps a build's version to one NATS micro accepts. Go
// stamps what a user's build gets: a tag ("v0.2.0" from go install
// ...@v0.2.0), a pseudo-version ("v0.0.0-20261201171517-a451f2be0959",
// "+dirty" for a modified tree) from go build in a clone, "(devel)"
// without version control; -ldflags -X main.version can set anything.
// micro refuses a leading "v" and anything not SemVer, and a refused
// version stopped the daemon at start, so: the version without its "v"
// when that is SemVer, else "0.0.0-dev" with what was given kept as build
// metadata where it can be, so `nats micro info` still shows it.
func ServiceVersion(v string) string {
	trimmed := strings.TrimPrefix(strings.TrimSpace(v), "v")
	if semVer.MatchString(trimmed) {
		return trimmed
	}
	// Build metadata: dot-separated identifiers of [0-9A-Za-z-].
	ids := strings.FieldsFunc(v, func(r rune) bool {
		return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-')
	})
	if len(ids) == 0 {
		return "0.0.0-dev"
	}
	return "0.0.0-dev+" + strings.Join(ids, ".")
}
