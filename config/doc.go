// Package config is kvroute's config file: each package's section composed into one
// document, decoded strictly (unknown and duplicate keys are errors naming the key) and
// validated section by section. `extproc validate` and the server run the same code.
package config
