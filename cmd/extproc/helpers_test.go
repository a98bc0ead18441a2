package main

import (
	"log/slog"

	"github.com/kvroute/kvroute/tokenize/models"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// approxTokenizersConfig is tokenizers: {default: {approx: true}}.
func approxTokenizersConfig() models.Config {
	return models.Config{models.DefaultKey: {Approx: true}}
}
