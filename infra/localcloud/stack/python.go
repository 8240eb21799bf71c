package stack

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// TrainerPythonEnv names the trainer's Python, the one the local cloud
// runs the data check with (make sets it to the virtualenv it builds).
const TrainerPythonEnv = "RAYDROP_TRAINER_PYTHON"

// TrainerPython is the trainer's Python: $RAYDROP_TRAINER_PYTHON, else the
// newest complete trainer virtualenv that make built into RAYDROP_CACHE
// (default ~/.cache/raydrop/trainer-venv-<hash>).
func TrainerPython() (string, error) {
	if p := os.Getenv(TrainerPythonEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", TrainerPythonEnv, err)
		}
		return p, nil
	}
	cache := os.Getenv("RAYDROP_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "raydrop")
	}
	venvs, _ := filepath.Glob(filepath.Join(cache, "trainer-venv-*", ".complete"))
	var newest string
	var newestTime time.Time
	for _, done := range venvs {
		if fi, err := os.Stat(done); err == nil && fi.ModTime().After(newestTime) {
			newest, newestTime = filepath.Join(filepath.Dir(done), "bin", "python"), fi.ModTime()
		}
	}
	if newest == "" {
		return "", fmt.Errorf("the local cloud runs the data check with the trainer's Python and found none in %s: run `make trainer-venv` in the repository root, or set %s", cache, TrainerPythonEnv)
	}
	return newest, nil
}
