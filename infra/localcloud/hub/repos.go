package hub

import (
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/json"
	"io/fs"
	"math/rand/v2"
	"strings"
)

// The repositories' files that are not random bytes, written by
// trainer/tests/hub_repos.py (trainer/tests/test_hub_repos.py checks they
// are what it writes).
//
//go:embed repos
var reposFS embed.FS

const (
	tinyModelDir = "repos/models/gemma3-tiny"
	// TutorialDatasetID is the tutorial's dataset, which the local Hub
	// holds in a small copy of its shape (TutorialDataset).
	TutorialDatasetID = "philschmid/amazon-product-descriptions-vlm"
	tutorialDir       = "repos/datasets/amazon-product-descriptions-vlm"
)

// Snapshot is the stand-in snapshot of a model repository: the tiny Gemma
// 3's config and processor (tokenizer, image processor, chat template),
// model.safetensors of size bytes of random weights seeded by the
// repository's name, and a generation_config.json.
func Snapshot(name string, size int) map[string][]byte {
	files := folder(tinyModelDir)
	files["generation_config.json"] = []byte(`{"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}`)
	files["model.safetensors"] = safetensors(name, size)
	return files
}

// TutorialDataset is the local Hub's dataset of the tutorial's shape: its
// README.md (the card, whose YAML names the data files and features) and
// data/train-00000-of-00001.parquet.
func TutorialDataset() map[string][]byte { return folder(tutorialDir) }

// folder is every file under dir of the embedded repositories, by path
// relative to dir.
func folder(dir string) map[string][]byte {
	out := map[string][]byte{}
	err := fs.WalkDir(reposFS, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := reposFS.ReadFile(p)
		out[strings.TrimPrefix(p, dir+"/")] = b
		return err
	})
	if err != nil {
		panic(err) // embedded at build time: cannot fail at run time
	}
	return out
}

// safetensors is one F32 tensor of n/4 seeded random values in the
// safetensors layout: the header's length (8 bytes, little-endian), the
// JSON header, the data.
func safetensors(seed string, n int) []byte {
	n -= n % 4
	head, _ := json.Marshal(map[string]any{"stand_in.weight": map[string]any{"dtype": "F32", "shape": []int{n / 4}, "data_offsets": []int{0, n}}})
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(head)))
	out = append(out, head...)
	h := sha256.Sum256([]byte(seed))
	r := rand.New(rand.NewChaCha8(h))
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return append(out, data...)
}
