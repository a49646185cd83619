package admission

// TenantsWaiting returns the number of (level, tenant) entries the queue holds.
func (c *Controller) TenantsWaiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.levels {
		n += len(c.levels[i].tenants)
	}
	return n
}

// Buckets returns the number of tenants the limiter keeps buckets for.
func (m *MemoryLimiter) Buckets() int { return len(m.tenants) }
