package stack

import (
	"fmt"
	"path/filepath"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
)

// TrainerPythonEnv names the trainer's Python, the one the local cloud
// runs the data check with (make sets it to the virtualenv it builds).
const TrainerPythonEnv = "RAYDROP_TRAINER_PYTHON"

// TrainerPython is the trainer's Python: $RAYDROP_TRAINER_PYTHON, else the
// newest complete trainer virtualenv that make built into RAYDROP_CACHE
// (default ~/.cache/raydrop/trainer-venv-<hash>).
func TrainerPython() (string, error) {
	done, pattern, err := emulators.FromCache(TrainerPythonEnv, filepath.Join("trainer-venv-*", ".complete"))
	switch {
	case err != nil:
		return "", err
	case done == "":
		return "", fmt.Errorf("the local cloud runs the data check with the trainer's Python and found none at %s: run `make trainer-venv` in the repository root, or set %s", pattern, TrainerPythonEnv)
	case filepath.Base(done) != ".complete":
		return done, nil // $RAYDROP_TRAINER_PYTHON itself
	}
	return filepath.Join(filepath.Dir(done), "bin", "python"), nil
}
