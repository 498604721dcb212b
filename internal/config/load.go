package config

import (
	"fmt"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix starts the environment name of every key: nats.url is
// DELAYD_NATS_URL, scanner.claim_batch is DELAYD_SCANNER_CLAIM_BATCH.
const EnvPrefix = "DELAYD_"

// EnvName returns the environment variable that sets key.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Load layers defaults, the YAML file at path (if not empty), the DELAYD_*
// environment read through getenv, and flags (koanf key → string value, only
// the flags given on the command line), then validates the result.
func Load(path string, getenv func(string) string, flags map[string]string) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, fmt.Errorf("config: defaults: %w", err)
	}
	defaults := k.All()

	if path != "" {
		fk := koanf.New(".")
		if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config: read %s: %w", path, err)
		}
		var unknown []string
		for _, key := range fk.Keys() {
			if _, ok := defaults[key]; !ok {
				unknown = append(unknown, key)
			}
		}
		if len(unknown) > 0 {
			return Config{}, fmt.Errorf("config: %s: unknown keys: %s", path, strings.Join(unknown, ", "))
		}
		if err := k.Merge(fk); err != nil {
			return Config{}, fmt.Errorf("config: merge %s: %w", path, err)
		}
	}

	// Env names are derived from the known keys rather than parsed back
	// into keys, because "_" is both the nesting separator and part of
	// names like claim_batch.
	env := map[string]any{}
	for key, def := range defaults {
		if v := getenv(EnvName(key)); v != "" {
			env[key] = coerce(def, v)
		}
	}
	if err := k.Load(confmap.Provider(env, "."), nil); err != nil {
		return Config{}, fmt.Errorf("config: env: %w", err)
	}

	fl := map[string]any{}
	for key, v := range flags {
		def, ok := defaults[key]
		if !ok {
			return Config{}, fmt.Errorf("config: flag for unknown key %q", key)
		}
		fl[key] = coerce(def, v)
	}
	if err := k.Load(confmap.Provider(fl, "."), nil); err != nil {
		return Config{}, fmt.Errorf("config: flags: %w", err)
	}

	var c Config
	if err := k.Unmarshal("", &c); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return c, c.Validate()
}

// coerce turns a string from env or flags into the shape of the default:
// lists are comma-separated; everything else is converted by koanf's
// weakly-typed decoding on Unmarshal.
func coerce(def any, v string) any {
	if _, ok := def.([]string); ok {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	return v
}

// YAML renders c with the config file's key names, secrets redacted: the
// output of `delayd config`, loadable as a config file.
func (c Config) YAML() ([]byte, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(c.Redacted(), "koanf"), nil); err != nil {
		return nil, err
	}
	return k.Marshal(yaml.Parser())
}
