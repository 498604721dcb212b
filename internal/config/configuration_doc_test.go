package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestConfigurationTableHasEveryKey: docs/configuration.md's table of
// settings has a row for every key of Config and none for a key Config
// lacks. A row names one key or several, `.x` short for a sibling of the
// key before it (`nats.tls.enabled`, `.ca_file`).
func TestConfigurationTableHasEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	inDoc := map[string]bool{}
	first := regexp.MustCompile(`(?m)^\| ([^|]+) \|`)
	name := regexp.MustCompile("`([a-z_.]+)`")
	for _, row := range first.FindAllStringSubmatch(string(b), -1) {
		parent := ""
		for _, m := range name.FindAllStringSubmatch(row[1], -1) {
			key := m[1]
			if strings.HasPrefix(key, ".") {
				key = parent + key
			} else if i := strings.LastIndex(key, "."); i >= 0 {
				parent = key[:i]
			}
			inDoc[key] = true
		}
	}
	inConfig := map[string]bool{}
	var walk func(prefix string, tp reflect.Type)
	walk = func(prefix string, tp reflect.Type) {
		for f := range tp.Fields() {
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			key := strings.TrimPrefix(prefix+"."+tag, ".")
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
				walk(key, f.Type)
				continue
			}
			inConfig[key] = true
		}
	}
	walk("", reflect.TypeFor[Config]())
	var missing, extra []string
	for k := range inConfig {
		if !inDoc[k] {
			missing = append(missing, k)
		}
	}
	for k := range inDoc {
		if !inConfig[k] {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("docs/configuration.md's table lacks %v and has rows for %v, which Config lacks", missing, extra)
	}
}
