package cause_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/runs"
)

// TestParseStacks reads stacks trainer/heartbeat.py wrote (testdata:
// rank 0 of a gloo process group waiting in a real all_reduce that rank
// 1 never joined) and a rank waiting outside any collective.
func TestParseStacks(t *testing.T) {
	b, err := os.ReadFile("testdata/stacks-all-reduce.txt")
	if err != nil {
		t.Fatal(err)
	}
	s := cause.ParseStacks("stacks/rank-00000.txt", string(b))
	if s.Rank != 0 || !s.InCollective || !strings.HasPrefix(s.Where, "all_reduce (torch/distributed/distributed_c10d.py:") || !strings.HasSuffix(s.Where, "work.wait()") {
		t.Fatalf("stacks %+v", s)
	}
	if !strings.Contains(s.Header, "asked by the monitor") || len(s.Frames) != 3 || !strings.HasPrefix(s.Frames[1], "wrapper (torch/distributed/c10d_logger.py:81)") {
		t.Fatalf("header %q frames %q", s.Header, s.Frames)
	}
	read := cause.ParseStacks("stacks/rank-00001.txt", `raydrop stacks of rank 1, pid 4243 on w-1, at 2026-12-07T10:00:00Z: its own step has not moved for 700 s (window 600 s)
last step 3, training since 09:48:20 UTC

Thread 0x7f3c9a2b5741 "MainThread" (most recent call last):
  File "/home/ray/anaconda3/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 733, in __next__
    data = self._next_data()
  File "/home/ray/anaconda3/lib/python3.11/threading.py", line 331, in wait
    gotit = waiter.acquire(True, timeout)

Thread 0x7f3c7d5fe641 "raydrop-heartbeat" (most recent call last):
  File "/code/heartbeat.py", line 312, in _serve
    self.look()
`)
	if read.Rank != 1 || read.InCollective || read.Where != "wait (threading.py:331): gotit = waiter.acquire(True, timeout)" {
		t.Fatalf("stacks %+v", read)
	}
	if got := cause.Outside([]cause.RankStack{s, read}); !slices.Equal(got, []int{1}) {
		t.Fatalf("outside %v, want [1]", got)
	}
	if got := cause.Outside([]cause.RankStack{read}); got != nil {
		t.Fatalf("outside %v with no rank in a collective", got)
	}

	// A run failed as stalled names the rank the others waited for.
	c := cause.Classify(cause.Input{Reason: runs.Stalled, Step: 3, Stacks: []cause.RankStack{s, read}})
	if c.Kind != "Stalled" || c.Rank != 1 || c.Source != "stacks/" || len(c.Lines) != 2 || !strings.HasPrefix(c.Lines[0], "rank 1: wait (threading.py:331)") ||
		!strings.Contains(c.Summary, "on rank 1, which waited outside the collective") {
		t.Fatalf("cause %+v", c)
	}
	if c := cause.Classify(cause.Input{Reason: runs.Stalled}); c.Kind != "Stalled" || c.Rank != -1 || len(c.Lines) != 0 {
		t.Fatalf("cause without stacks %+v", c)
	}

	dir := t.TempDir()
	folder := "raydrop/r/evidence/attempt-1"
	for name, text := range map[string][]byte{"rank-00000.txt": b, "rank-00001.txt": []byte(read.Header + "\n")} {
		p := filepath.Join(dir, folder, checkpoints.StacksDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, text, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := cause.ReadStacks(context.Background(), checkpoints.Dir(dir), folder)
	if err != nil || len(got) != 2 || got[0].Rank != 0 || got[1].Rank != 1 || got[0].Source != "stacks/rank-00000.txt" {
		t.Fatalf("read %+v, %v", got, err)
	}
}
