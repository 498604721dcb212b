package deploy

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/config"
)

// TestSchemaKnowsEveryConfigKey: the chart's schema lists exactly delayd's
// config keys (so it refuses unknown ones, as delayd does), and every
// duration key needs a unit. A key added to the config without the schema,
// or the other way round, fails here.
func TestSchemaKnowsEveryConfigKey(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	type node struct {
		Type                 string                     `json:"type"`
		Pattern              string                     `json:"pattern"`
		AdditionalProperties *bool                      `json:"additionalProperties"`
		Properties           map[string]json.RawMessage `json:"properties"`
	}
	inSchema := map[string]node{}
	var walk func(prefix string, raw json.RawMessage)
	walk = func(prefix string, raw json.RawMessage) {
		var n node
		if err := json.Unmarshal(raw, &n); err != nil {
			t.Fatal(err)
		}
		if n.Properties == nil {
			inSchema[prefix] = n
			return
		}
		if n.AdditionalProperties == nil || *n.AdditionalProperties {
			t.Errorf("schema %q allows unknown keys", prefix)
		}
		for k, v := range n.Properties {
			walk(strings.TrimPrefix(prefix+"."+k, "."), v)
		}
	}
	walk("", schema.Properties["config"])

	inConfig := map[string]reflect.Type{}
	var fields func(prefix string, tp reflect.Type)
	fields = func(prefix string, tp reflect.Type) {
		for i := range tp.NumField() {
			f := tp.Field(i)
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			k := strings.TrimPrefix(prefix+"."+tag, ".")
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				fields(k, f.Type)
				continue
			}
			inConfig[k] = f.Type
		}
	}
	fields("", reflect.TypeOf(config.Config{}))

	var missing, extra []string
	for k, tp := range inConfig {
		n, ok := inSchema[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		if tp == reflect.TypeOf(time.Duration(0)) && (n.Type != "string" || n.Pattern == "") {
			t.Errorf("schema %q: a duration must be a string with a unit pattern, got %+v", k, n)
		}
	}
	for k := range inSchema {
		if _, ok := inConfig[k]; !ok {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("schema and config differ: keys missing from the schema %v, keys the config lacks %v", missing, extra)
	}
}
