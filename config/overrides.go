package config

import "os"

// Overrides are command-line values that replace the file's; an empty one keeps the
// file's value.
type Overrides struct {
	GRPCAddress, AdminAddress, LogLevel string
}

// LoadWith reads the file as Load does, applies the overrides and validates the result:
// what the server runs, at start and at each reload. The file is validated only with
// the overrides applied, so a flag replaces a bad value rather than being refused
// with it.
func LoadWith(path string, o Overrides) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	cfg, err := decode(raw)
	if err != nil {
		return Config{}, err
	}
	for _, f := range []struct {
		value string
		key   *string
	}{{o.GRPCAddress, &cfg.GRPCAddress}, {o.AdminAddress, &cfg.AdminAddress}, {o.LogLevel, &cfg.LogLevel}} {
		if f.value != "" {
			*f.key = f.value
		}
	}
	return cfg, cfg.Validate()
}
