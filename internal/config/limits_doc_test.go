package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestLimitsTableMatchesTheCode: the limits table lives in one place,
// docs/protocol.md, with a row for every limits.* key, the default the
// code has for max_payload, and the README and RELIABILITY.md link to it.
func TestLimitsTableMatchesTheCode(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	proto := read("docs/protocol.md")
	i := strings.Index(proto, "\n## Limits\n")
	if i < 0 {
		t.Fatal("docs/protocol.md has no \"## Limits\" section")
	}
	section := proto[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	rows := map[string]string{} // key → default column
	for _, m := range regexp.MustCompile("(?m)^\\| [^|]+ \\| `limits\\.(\\w+)` \\| ([^|]+) \\|").FindAllStringSubmatch(section, -1) {
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	typ := reflect.TypeOf(Limits{})
	for f := range typ.Fields() {
		if key := f.Tag.Get("koanf"); rows[key] == "" {
			t.Errorf("docs/protocol.md's limits table has no row for limits.%s", key)
		}
	}
	if Default().Limits.MaxPayload != 0 || !strings.HasPrefix(rows["max_payload"], "`0`") {
		t.Errorf("limits.max_payload: the code's default is %d, the table says %q", Default().Limits.MaxPayload, rows["max_payload"])
	}
	for _, doc := range []string{"README.md", "docs/RELIABILITY.md"} {
		if !strings.Contains(read(doc), "protocol.md#limits") {
			t.Errorf("%s does not link to the limits table (protocol.md#limits)", doc)
		}
	}
	if strings.Count(read("docs/RELIABILITY.md"), "| `limits.") > 0 {
		t.Error("docs/RELIABILITY.md has a limits table of its own again: link to protocol.md#limits")
	}
}
