// Package trainer embeds raydrop's Python trainer so the Go functions can
// ship it to the cluster in a ConfigMap, and exposes its pinned
// requirements, the single source of truth for the RayJob runtime env.
package trainer

import (
	"embed"
	"strings"
)

// Files holds the trainer modules (flat: they are mounted from a ConfigMap
// at /code/) and requirements.txt.
//
//go:embed *.py requirements.txt
var Files embed.FS

// Requirements returns the pinned requirements, one "name==version" each, in
// file order, without comments or blank lines.
func Requirements() []string {
	b, err := Files.ReadFile("requirements.txt")
	if err != nil {
		panic(err) // embedded at build time
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}
