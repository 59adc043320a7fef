package console

import "github.com/go-chi/chi/v5"

// Routes is the router c serves, for the console's authorization matrix.
func Routes(c *Console) (chi.Routes, bool) {
	r, ok := c.handler.(chi.Routes)
	return r, ok
}
