package config

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

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

// OtherEnv are DELAYD_* variables that are not config keys but are read
// elsewhere, so the unknown-variable check lets them through. A new
// DELAYD_* knob (in a test too) must be added here.
var OtherEnv = []string{
	"DELAYD_CONFIG", // the config file, read by the commands
	// Test and CI knobs.
	"DELAYD_TEST_LOG", "DELAYD_BENCH_BIG", "DELAYD_CHAOS_DURATION", "DELAYD_CHAOS_SEED",
	"DELAYD_MODEL_STEPS", "DELAYD_MODEL_SEED", "DELAYD_SCREENSHOTS", "DELAYD_HELM", "DELAYD_SOAK",
	"DELAYD_CLIENT_TEST_NATS_URL", "DELAYD_TOOLS_DIR",
}

// Sources are the layers Load reads, lowest first after the defaults.
type Sources struct {
	// Path is the YAML config file; empty for none.
	Path string
	// Getenv reads one environment variable.
	Getenv func(string) string
	// Environ lists the environment as "NAME=value" (os.Environ) or bare
	// names. It says which variables are set, even to the empty string,
	// and every DELAYD_* name in it must be a key or one of OtherEnv.
	Environ []string
	// Flags are koanf key → value, only the flags given.
	Flags map[string]string
}

// Load layers defaults, the YAML file, the DELAYD_* environment and flags,
// then validates the result. Every problem (unknown key or variable, a
// value of the wrong type, a failed validation) is reported, together,
// each with its key and where it came from.
//
// Values are strict: durations need a unit ("5s"; a bare 0 is allowed),
// numbers and booleans must parse, strings in YAML must be strings. A
// variable set to the empty string sets a string key to "" (so
// DELAYD_HTTP_ADDR= turns the admin server off) and a list to no entries;
// it is an error for a number, boolean or duration.
func Load(src Sources) (Config, error) {
	getenv := src.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, fmt.Errorf("config: defaults: %w", err)
	}
	defaults := k.All()
	var errs []error
	layer := map[string]any{}

	if src.Path != "" {
		fk := koanf.New(".")
		if err := fk.Load(file.Provider(src.Path), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config: read %s: %w", src.Path, err)
		}
		raw := fk.All()
		mapped := map[string]bool{}
		for _, key := range sortedKeys(raw) {
			if owner, ok := underHidden(key); ok {
				// A map given to a hidden key arrives flattened into
				// keys below it, made of the map's keys: name the key
				// it was given to, and none of the map.
				if !mapped[owner] {
					mapped[owner] = true
					errs = append(errs, fmt.Errorf("%s (in %s): a map is not %s: quote it (the value is not shown)", owner, src.Path, kindOf(defaults[owner])))
				}
				continue
			}
			def, ok := defaults[key]
			if !ok {
				errs = append(errs, fmt.Errorf("%s (in %s): unknown key%s", key, src.Path, suggest(key, sortedKeys(defaults))))
				continue
			}
			v, err := fromYAML(def, raw[key], hidden(key))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s (in %s): %w", key, src.Path, err))
				continue
			}
			layer[key] = v
		}
	}

	// Env names are derived from the known keys rather than parsed back
	// into keys, because "_" is both the nesting separator and part of
	// names like claim_batch.
	set := map[string]bool{}
	for _, kv := range src.Environ {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	known := map[string]bool{}
	for _, n := range OtherEnv {
		known[n] = true
	}
	for _, key := range sortedKeys(defaults) {
		name := EnvName(key)
		known[name] = true
		v := getenv(name)
		if v == "" && !set[name] {
			continue
		}
		tv, err := fromString(defaults[key], v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (env %s): %w", key, name, err))
			continue
		}
		layer[key] = tv
	}
	var names []string
	for name := range set {
		if strings.HasPrefix(name, EnvPrefix) && !known[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		errs = append(errs, fmt.Errorf("env %s: unknown variable%s", name, suggest(name, sortedKeys(known))))
	}

	for _, key := range sortedKeys(src.Flags) {
		def, ok := defaults[key]
		if !ok {
			errs = append(errs, fmt.Errorf("%s (flag): unknown key%s", key, suggest(key, sortedKeys(defaults))))
			continue
		}
		tv, err := fromString(def, src.Flags[key])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (flag): %w", key, err))
			continue
		}
		layer[key] = tv
	}

	if err := k.Load(confmap.Provider(layer, "."), nil); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	var c Config
	if err := k.Unmarshal("", &c); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// fromYAML checks a value from the file against the type of the key's
// default and converts it. With hide, no error quotes any part of v, only
// its kind.
func fromYAML(def, v any, hide bool) (any, error) {
	if v == nil { // "key:" with no value, as in YAML null
		v = ""
	}
	if hide {
		if _, isStr := v.(string); !isStr {
			if _, err := fromYAML(def, v, false); err != nil {
				if list, ok := v.([]any); ok {
					if _, want := def.([]string); want {
						for i, item := range list {
							if _, ok := item.(string); !ok {
								return nil, fmt.Errorf("list item %d is %s, not a string: quote it (the value is not shown)", i+1, describe(item))
							}
						}
					}
				}
				return nil, fmt.Errorf("%s is not %s: quote it (the value is not shown)", describe(v), kindOf(def))
			}
		}
	}
	if s, ok := v.(string); ok {
		if _, isStr := def.(string); !isStr {
			return fromString(def, s)
		}
		return s, nil
	}
	switch def.(type) {
	case time.Duration:
		if n, ok := asInt(v); ok {
			if n == 0 {
				return time.Duration(0), nil
			}
			return nil, fmt.Errorf("%d has no unit (it would be %d nanoseconds): write a duration with a unit, e.g. %ds or %dms", n, n, n, n)
		}
		return nil, fmt.Errorf("%v is not a duration: write e.g. 5s, 1500ms or 2m", v)
	case int, int64:
		if n, ok := asInt(v); ok {
			return sameInt(def, n), nil
		}
		return nil, fmt.Errorf("%v is not a whole number", v)
	case bool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, fmt.Errorf("%v is not true or false", v)
	case string:
		return nil, fmt.Errorf("%v is not a string: quote it", v)
	case []string:
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("%v is not a list of strings", v)
		}
		out := make([]string, 0, len(list))
		for _, item := range list {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("list item %v is not a string: quote it", item)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported value %v", v)
}

// fromString converts a value from the environment, a flag or a YAML
// string to the type of the key's default. Lists are comma-separated.
func fromString(def any, s string) (any, error) {
	switch def.(type) {
	case time.Duration:
		if s == "" {
			return nil, errors.New(`empty: unset it to keep the default, or give a duration such as "5s"`)
		}
		d, err := time.ParseDuration(s)
		if err == nil {
			return d, nil
		}
		if n, nerr := strconv.ParseInt(s, 10, 64); nerr == nil {
			return nil, fmt.Errorf("%q has no unit: write a duration with a unit, e.g. %ds or %dms", s, n, n)
		}
		return nil, fmt.Errorf("%q is not a duration: write e.g. 5s, 1500ms or 2m", s)
	case int, int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", s)
		}
		return sameInt(def, n), nil
	case bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q is not true or false", s)
		}
		return b, nil
	case []string:
		out := []string{}
		for _, item := range strings.Split(s, ",") {
			if item = strings.TrimSpace(item); item != "" {
				out = append(out, item)
			}
		}
		return out, nil
	}
	return s, nil
}

// sameInt returns n as the integer type of def (int or int64).
func sameInt(def any, n int64) any {
	if _, ok := def.(int); ok {
		return int(n)
	}
	return n
}

func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case uint64:
		return int64(n), true
	case float64:
		if n == float64(int64(n)) {
			return int64(n), true
		}
	}
	return 0, false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// suggest returns `: did you mean X?` for the candidate nearest to name.
func suggest(name string, candidates []string) string {
	for key, why := range removed {
		if name == key || name == EnvName(key) {
			return ": removed: " + why
		}
	}
	best, bestD := "", -1
	for _, c := range candidates {
		if d := distance(strings.ToLower(name), strings.ToLower(c)); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return ": did you mean " + best + "?"
}

// removed are the keys a release took out, and what to do instead: named
// rather than taken for a typo of another.
var removed = map[string]string{
	"redis.due_buckets": "the due buckets (stored format 4) are retired; take the key out, " +
		"and if it was on, run `delayd migrate` once (docs/operations.md, Upgrading)",
}

// distance is the Levenshtein edit distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// YAML renders c with the config file's key names, secrets redacted: the
// output of `delayd config`, loadable as a config file.
func (c Config) YAML() ([]byte, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(c.Redacted(), "koanf"), nil); err != nil {
		return nil, err
	}
	// Durations as "10s", not nanoseconds: the output must load again.
	out := map[string]any{}
	for key, v := range k.All() {
		if d, ok := v.(time.Duration); ok {
			v = d.String()
		}
		out[key] = v
	}
	k = koanf.New(".")
	if err := k.Load(confmap.Provider(out, "."), nil); err != nil {
		return nil, err
	}
	return k.Marshal(yaml.Parser())
}

// hiddenKeys are the keys whose values no error quotes: the secrets, and
// the addresses, which may carry credentials in their user info.
func hiddenKeys() []string { return append([]string{"nats.url", "redis.addrs"}, SecretKeys...) }

func hidden(key string) bool {
	for _, k := range hiddenKeys() {
		if key == k {
			return true
		}
	}
	return false
}

// underHidden reports the hidden key that key lies below, if any: YAML
// "password: {a: b}" reaches Load as the key password.a.
func underHidden(key string) (string, bool) {
	for _, k := range hiddenKeys() {
		if strings.HasPrefix(key, k+".") {
			return k, true
		}
	}
	return "", false
}

// describe names the kind of a YAML value without showing it.
func describe(v any) string {
	switch v.(type) {
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	case string:
		return "a string"
	}
	if _, ok := asInt(v); ok {
		return "a number"
	}
	if _, ok := v.(float64); ok {
		return "a number"
	}
	return "a value of another type"
}

// kindOf names the type a key takes, from its default.
func kindOf(def any) string {
	if _, ok := def.([]string); ok {
		return "a list of strings"
	}
	return "a string"
}

// WantsJSONLog reports whether src asks for log.json, by the same order
// of layers as Load (flags, then the environment, then the file), even
// when the configuration is otherwise invalid: a refusal is then logged
// as JSON too. A value that does not parse as a boolean asks for nothing.
func WantsJSONLog(src Sources) bool {
	const key = "log.json"
	if v, ok := src.Flags[key]; ok {
		b, _ := strconv.ParseBool(v)
		return b
	}
	if src.Getenv != nil {
		if v := src.Getenv(EnvName(key)); v != "" {
			b, _ := strconv.ParseBool(v)
			return b
		}
	}
	if src.Path == "" {
		return false
	}
	fk := koanf.New(".")
	if err := fk.Load(file.Provider(src.Path), yaml.Parser()); err != nil {
		return false
	}
	b, _ := fk.Get(key).(bool)
	return b
}
