package config

import (
	"path/filepath"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
)

// The example configs must stay loadable: an unknown or misspelled key is
// an error.
func TestExampleConfigsLoad(t *testing.T) {
	files, _ := filepath.Glob("../../configs/*.yaml")
	if len(files) == 0 {
		t.Fatal("no example configs found")
	}
	for _, f := range files {
		if _, err := Load(Sources{Path: f}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// The reference config must show every key.
func TestReferenceConfigCoversEveryKey(t *testing.T) {
	ref := loadKeys(t, "../../configs/delayd.yaml")
	defaults := koanf.New(".")
	if err := defaults.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range defaults.Keys() {
		if !ref[k] {
			t.Errorf("configs/delayd.yaml lacks %s", k)
		}
	}
}

func loadKeys(t *testing.T, path string) map[string]bool {
	t.Helper()
	k := koanf.New(".")
	if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, key := range k.Keys() {
		out[key] = true
	}
	return out
}
