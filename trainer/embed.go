// Package trainer embeds raydrop's Python trainer so the Go functions can
// ship it to the cluster in a ConfigMap, and exposes its pinned
// requirements, the single source of truth for the RayJob runtime env, and
// its training defaults, the single source of the job spec's.
package trainer

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"strings"
)

// Files holds the trainer modules (flat: they are mounted from a ConfigMap
// at /code/), defaults.json and requirements.txt.
//
//go:embed *.py defaults.json requirements.txt
var Files embed.FS

// ImageFiles are what the trainer image is built from (image/): its
// Dockerfile, the script that installs the lock, and the locks.
//
//go:embed image/Dockerfile image/install.sh image/requirements.lock image/uv.lock.txt
var ImageFiles embed.FS

// ImageDigest is a digest of ImageFiles ("sha256:<hex>"), which changes
// whenever the image they build would. The local cloud, which builds no
// image, names its trainer image by it; it is not the digest a registry
// would give the real image.
func ImageDigest() string {
	h := sha256.New()
	err := fs.WalkDir(ImageFiles, "image", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := ImageFiles.ReadFile(path)
		h.Write([]byte(path + "\x00"))
		h.Write(b)
		return err
	})
	if err != nil {
		panic(err) // embedded at build time
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// DefaultsFile is the trainer's defaults, read by the trainer's command
// line, the job spec and the GPU benchmark alike.
const DefaultsFile = "defaults.json"

// TrainingDefaults are the defaults that decide a step's cost and which
// rows train: one fast configuration that every run, the command line and
// the benchmark share.
type TrainingDefaults struct {
	PerDeviceBatchSize        int     `json:"perDeviceBatchSize"`
	GradientAccumulationSteps int     `json:"gradientAccumulationSteps"`
	GradientCheckpointing     bool    `json:"gradientCheckpointing"`
	MaxSeqLength              int     `json:"maxSeqLength"`
	MaxDroppedShare           float64 `json:"maxDroppedShare"`
	// Template is the tutorial's prompt and columns: the dataset format's
	// defaults, so that the example spec trains as the tutorial did.
	Template struct {
		System         string   `json:"system"`
		Prompt         string   `json:"prompt"`
		Answer         string   `json:"answer"`
		Images         []string `json:"images"`
		ImagePlacement string   `json:"imagePlacement"`
	} `json:"template"`
	Messages struct {
		Column       string `json:"column"`
		ImagesColumn string `json:"imagesColumn"`
	} `json:"messages"`
}

// Defaults returns the embedded defaults.json.
func Defaults() TrainingDefaults {
	b, err := Files.ReadFile(DefaultsFile)
	if err != nil {
		panic(err) // embedded at build time
	}
	var d TrainingDefaults
	if err := json.Unmarshal(b, &d); err != nil {
		panic("trainer/" + DefaultsFile + ": " + err.Error())
	}
	return d
}

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
