package checkpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// DataCheckFile is what trainer/datacheck.py writes in the run's storage
// path (beside the attempts' experiment folders).
const DataCheckFile = "data-check.json"

// maxDataCheck bounds the read of data-check.json.
const maxDataCheck = 1 << 20

// DataCheck is the data check's verdict and figures, as datacheck.py
// writes them; the pipeline keeps them in the run record and its events.
type DataCheck struct {
	OK bool `json:"ok"`
	// Reason is InvalidData or InvalidModel when the check refused the run,
	// Message what it found (file, row and column).
	Reason   string           `json:"reason,omitempty"`
	Message  string           `json:"message,omitempty"`
	Dataset  *CheckDataset    `json:"dataset,omitempty"`
	Rows     *CheckRows       `json:"rows,omitempty"`
	LeftOut  map[string]int64 `json:"leftOut,omitempty"`
	Tokens   *CheckTokens     `json:"tokens,omitempty"`
	Images   *CheckImages     `json:"images,omitempty"`
	Steps    *CheckSteps      `json:"steps,omitempty"`
	Estimate *CheckEstimate   `json:"estimate,omitempty"`
	Seconds  float64          `json:"seconds,omitempty"`
}

// CheckDataset is the data the check read: its source and split, the
// revision the spec asked for, and the commit that revision pointed at on the
// Hub when the check read it (training then reads that commit).
type CheckDataset struct {
	Source           string `json:"source"`
	Split            string `json:"split"`
	Revision         string `json:"revision,omitempty"`
	ResolvedRevision string `json:"resolvedRevision,omitempty"`
}

// CheckRows counts the training split's rows: all, those kept by the
// length filter, the training and held-out shares, those left out.
type CheckRows struct {
	Total   int64 `json:"total"`
	Kept    int64 `json:"kept"`
	Train   int64 `json:"train"`
	Eval    int64 `json:"eval"`
	LeftOut int64 `json:"leftOut"`
}

// CheckTokens are the kept rows' token lengths (image blocks included) and
// totals.
type CheckTokens struct {
	P50          int64 `json:"p50"`
	P90          int64 `json:"p90"`
	Max          int64 `json:"max"`
	MaxSeqLength int64 `json:"maxSeqLength"`
	Answer       int64 `json:"answer"`
	Train        int64 `json:"train"`
	Eval         int64 `json:"eval"`
}

// CheckImages counts the images decoded, and the rows by their image count.
type CheckImages struct {
	Total  int64            `json:"total"`
	PerRow map[string]int64 `json:"perRow,omitempty"`
}

// CheckSteps are the optimizer steps the run will take.
type CheckSteps struct {
	PerEpoch int64 `json:"perEpoch"`
	Total    int64 `json:"total"`
}

// CheckEstimate is the run's training time and price at the configured
// throughput.
type CheckEstimate struct {
	Seconds  float64 `json:"seconds"`
	GPUHours float64 `json:"gpuHours"`
	USD      float64 `json:"usd"`
}

// ReadDataCheck reads the data check of the run whose storage path is
// prefix in st; nil when the check has written nothing (yet).
func ReadDataCheck(ctx context.Context, st Store, prefix string) (*DataCheck, error) {
	name := strings.TrimSuffix(prefix, "/") + "/" + DataCheckFile
	b, err := st.Read(ctx, name, maxDataCheck)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", st.URI(name), err)
	}
	var c DataCheck
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parse %s: %w: %w", st.URI(name), ErrUnreadable, err)
	}
	if !c.OK && c.Reason == "" {
		return nil, fmt.Errorf("%s refuses the run without a reason: %w", st.URI(name), ErrUnreadable)
	}
	return &c, nil
}
