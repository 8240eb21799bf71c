package kubesim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	trainercode "github.com/raydrop/raydrop/trainer"
)

// trainerArgs are the trainer flags the player acts on (see
// trainer/README.md); every flag given is kept in all.
type trainerArgs struct {
	all           map[string]string // flag name without "--" -> value
	runID         string
	storagePath   string // gs://bucket[/prefix]
	experiment    string
	epochs        int
	maxSteps      int
	resumeFrom    string
	markNotice    string // gs://bucket/raydrop-marks/<run>/attempt-<n>.json
	saveStrategy  string
	saveSteps     int
	learningRate  float64
	warmupRatio   float64
	numWorkers    int
	batchSize     int
	gradAccum     int
	modelID       string
	loraR         int
	loraAlpha     int
	loraDropout   float64
	targetModules string
	visionTower   bool
	loggingSteps  int
	seed          int
	maxSeqLength  int
	// maxDroppedShare is the largest share of rows the length filter may
	// leave out before the trainer refuses to train.
	maxDroppedShare float64
	evalShare       float64 // share of the rows held out for evaluation
	evalSplit       string
	sampleAnswers   int
	bucket, prefix  string // storagePath split
	check           bool   // the data check (datacheck.py), not training
}

// parseEntrypoint reads `python /code/train.py --flag value ...` as a
// shell would split it, then the trainer's flags with its defaults. An
// error is what the trainer's argument parser would reject (exit code 2).
func parseEntrypoint(entrypoint string) (*trainerArgs, error) {
	words, err := splitWords(entrypoint)
	if err != nil {
		return nil, err
	}
	i := 0
	for i < len(words) && !strings.HasSuffix(words[i], "train.py") && !strings.HasSuffix(words[i], "/"+checkScript) {
		i++
	}
	if i == len(words) {
		return nil, fmt.Errorf("entrypoint %q runs neither train.py nor %s", entrypoint, checkScript)
	}
	rest := words[i+1:]
	all := map[string]string{}
	for j := 0; j < len(rest); j += 2 {
		name, ok := strings.CutPrefix(rest[j], "--")
		if !ok || name == "" {
			return nil, fmt.Errorf("unrecognized argument %q", rest[j])
		}
		if j+1 >= len(rest) {
			return nil, fmt.Errorf("argument --%s: expected one argument", name)
		}
		all[name] = rest[j+1]
	}
	a := &trainerArgs{all: all, check: strings.HasSuffix(words[i], "/"+checkScript)}
	str := func(name, def string) string {
		if v, ok := all[name]; ok {
			return v
		}
		return def
	}
	var errs []error
	num := func(name string, def int) int {
		v, ok := all[name]
		if !ok {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("argument --%s: invalid int value: %q", name, v))
		}
		return n
	}
	flt := func(name string, def float64) float64 {
		v, ok := all[name]
		if !ok {
			return def
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("argument --%s: invalid float value: %q", name, v))
		}
		return f
	}
	a.runID = str("run-id", "local")
	a.storagePath = strings.TrimRight(str("storage-path", ""), "/")
	a.experiment = str("experiment-name", "raydrop-"+a.runID)
	a.epochs = num("epochs", 3)
	a.maxSteps = num("max-steps", -1)
	a.resumeFrom = str("resume-from", "")
	a.markNotice = str("mark-notice", "")
	a.saveStrategy = str("save-strategy", "epoch")
	a.saveSteps = num("save-steps", 100)
	a.learningRate = flt("learning-rate", 2e-4)
	a.warmupRatio = flt("warmup-ratio", 0.03)
	a.numWorkers = num("num-workers", 16)
	td := trainercode.Defaults()
	a.batchSize = num("per-device-batch-size", td.PerDeviceBatchSize)
	a.gradAccum = num("gradient-accumulation-steps", td.GradientAccumulationSteps)
	a.modelID = str("model-id", "google/gemma-3-4b-it")
	a.loraR = num("lora-r", 16)
	a.loraAlpha = num("lora-alpha", 16)
	a.loraDropout = flt("lora-dropout", 0.05)
	a.targetModules = str("lora-target-modules", "all-linear")
	a.visionTower = str("lora-vision-tower", "false") == "true"
	a.loggingSteps = num("logging-steps", 10)
	a.seed = num("seed", 42)
	a.maxSeqLength = num("max-seq-length", td.MaxSeqLength)
	a.maxDroppedShare = flt("max-dropped-share", td.MaxDroppedShare)
	a.evalShare = flt("eval-share", 0.05)
	a.evalSplit = str("eval-split", "")
	a.sampleAnswers = num("sample-answers", 8)
	if a.storagePath == "" {
		errs = append(errs, errors.New("the following arguments are required: --storage-path"))
	} else if b, p, ok := splitGS(a.storagePath); !ok {
		errs = append(errs, fmt.Errorf("argument --storage-path: only gs:// storage paths are served here, got %q", a.storagePath))
	} else {
		a.bucket, a.prefix = b, p
	}
	if a.experiment == "" || strings.Contains(a.experiment, "/") {
		errs = append(errs, fmt.Errorf("argument --experiment-name: one path segment, got %q", a.experiment))
	}
	if a.resumeFrom != "" {
		if _, _, ok := splitGS(a.resumeFrom); !ok {
			errs = append(errs, fmt.Errorf("argument --resume-from: only gs:// checkpoints are served here, got %q", a.resumeFrom))
		}
	}
	if a.markNotice != "" {
		if _, _, ok := splitGS(a.markNotice); !ok {
			errs = append(errs, fmt.Errorf("argument --mark-notice: only gs:// objects are served here, got %q", a.markNotice))
		}
	}
	if a.saveStrategy != "epoch" && a.saveStrategy != "steps" {
		errs = append(errs, fmt.Errorf("argument --save-strategy: invalid choice: %q (choose from 'epoch', 'steps')", a.saveStrategy))
	}
	if a.epochs < 1 && a.maxSteps <= 0 {
		errs = append(errs, errors.New("argument --epochs: at least 1 unless --max-steps is set"))
	}
	if a.saveSteps < 1 {
		a.saveSteps = 1
	}
	if a.numWorkers < 1 {
		a.numWorkers = 1
	}
	if a.batchSize < 1 {
		a.batchSize = 1
	}
	if a.gradAccum < 1 {
		a.gradAccum = 1
	}
	return a, errors.Join(errs...)
}

// experimentName is the experiment folder's object name prefix (no
// trailing slash).
func (a *trainerArgs) experimentName() string { return joinName(a.prefix, a.experiment) }

// splitGS splits gs://bucket/name into bucket and name (name may be "").
func splitGS(uri string) (bucket, name string, ok bool) {
	rest, ok := strings.CutPrefix(uri, "gs://")
	if !ok {
		return "", "", false
	}
	bucket, name, _ = strings.Cut(rest, "/")
	return bucket, strings.Trim(name, "/"), bucket != ""
}

func joinName(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p = strings.Trim(p, "/"); p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "/")
}

// splitWords splits a command line into words the way a POSIX shell does
// for plain words and single, double and backslash quoting (no expansion).
func splitWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case ' ', '\t', '\n':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case '\'':
			in = true
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote in entrypoint")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case '"':
			in = true
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`\n", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote in entrypoint")
			}
		case '\\':
			in = true
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
		default:
			in = true
			cur.WriteByte(c)
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}
