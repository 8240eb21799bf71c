package functions_test

import (
	"slices"
	"testing"

	"github.com/raydrop/raydrop/functions"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// TestEveryFunctionHasItsHandler: the registry and the wiring table name
// the same functions, so neither a deployed function without a handler
// nor a handler no trigger reaches can be added by mistake.
func TestEveryFunctionHasItsHandler(t *testing.T) {
	var wired []string
	for _, f := range wiring.Functions {
		wired = append(wired, f.Name)
		if _, ok := functions.Handlers[f.Name]; !ok {
			t.Errorf("function %s of the wiring table has no handler", f.Name)
		}
	}
	for name := range functions.Handlers {
		if !slices.Contains(wired, name) {
			t.Errorf("handler %s is not a function of the wiring table", name)
		}
	}
}
