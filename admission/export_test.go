package admission

// SetMaxPlans bounds how many plans s keeps (default 100,000), so that a
// test can fill its cache with a few customers.
func SetMaxPlans(s *Store, n int) { s.plans.max = n }
