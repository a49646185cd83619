package config_test

import (
	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
)

// ca is cache_aware's knobs in c (the policy registers them; config knows no policy).
func ca[C config.Config | *config.Config](c C) *cacheaware.Knobs {
	switch c := any(c).(type) {
	case config.Config:
		return cacheaware.KnobsIn(c.PolicyOptions)
	case *config.Config:
		return cacheaware.KnobsIn(c.PolicyOptions)
	}
	return nil
}
