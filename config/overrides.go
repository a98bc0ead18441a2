package config

// Overrides are command-line values that replace the file's; an empty one keeps the
// file's value.
type Overrides struct {
	GRPCAddress, AdminAddress, LogLevel string
}

// LoadWith reads the file as Load does, applies the overrides and validates the result:
// what the server runs, at start and at each reload.
func LoadWith(path string, o Overrides) (Config, error) {
	cfg, err := Load(path)
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
