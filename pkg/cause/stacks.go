package cause

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// RankStack is what one rank's stacks say (trainer/heartbeat.py writes
// them to the evidence folder's stacks/ when a stall is suspected): where
// its main thread waits.
type RankStack struct {
	Rank   int    `json:"rank"` // -1: the header does not say
	Source string `json:"source"`
	// Header is the file's first line: the rank, its process, when and why.
	Header string `json:"header"`
	// Where is the main thread's innermost frame: "all_reduce
	// (torch/distributed/distributed_c10d.py:2810): work.wait()".
	Where string `json:"where"`
	// InCollective: the main thread waits in torch.distributed (a
	// collective the other ranks must join).
	InCollective bool `json:"inCollective"`
	// Frames are the main thread's innermost frames, outermost first.
	Frames []string `json:"frames"`
}

// maxFrames is how many of a main thread's frames a RankStack keeps.
const maxFrames = 8

var (
	stackRankRE  = regexp.MustCompile(`^raydrop stacks of rank (\d+)`)
	stackFrameRE = regexp.MustCompile(`^\s*File "([^"]+)", line (\d+), in (.+)$`)
)

// ParseStacks reads one rank's stacks file.
func ParseStacks(source, text string) RankStack {
	lines := strings.Split(text, "\n")
	s := RankStack{Rank: -1, Source: source, Frames: []string{}}
	if len(lines) > 0 {
		s.Header = lines[0]
		if m := stackRankRE.FindStringSubmatch(lines[0]); m != nil {
			if r, err := strconv.Atoi(m[1]); err == nil {
				s.Rank = r
			}
		}
	}
	in := false
	var frames []string
	for i, l := range lines {
		if strings.HasPrefix(l, "Thread ") {
			in = strings.Contains(l, `"MainThread"`)
			continue
		}
		if !in {
			continue
		}
		if l == "" {
			break
		}
		m := stackFrameRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		code := ""
		if i+1 < len(lines) && !stackFrameRE.MatchString(lines[i+1]) {
			code = strings.TrimSpace(lines[i+1])
		}
		file := shortFile(m[1])
		frames = append(frames, fmt.Sprintf("%s (%s:%s): %s", m[3], file, m[2], code))
		if strings.HasPrefix(file, "torch/distributed/") {
			s.InCollective = true
		}
	}
	if n := len(frames); n > 0 {
		s.Where = frames[n-1]
		s.Frames = frames[max(0, n-maxFrames):]
	}
	return s
}

// shortFile is a source file's path from its package: site-packages/
// and the interpreter's prefix left out.
func shortFile(f string) string {
	if _, after, ok := strings.Cut(f, "site-packages/"); ok {
		return after
	}
	if i := strings.Index(f, "/lib/python3"); i >= 0 {
		if j := strings.Index(f[i+len("/lib/"):], "/"); j >= 0 {
			return f[i+len("/lib/")+j+1:]
		}
	}
	return f
}

// ReadStacks reads the ranks' stacks in an attempt's evidence folder, by
// rank; none when no rank wrote any.
func ReadStacks(ctx context.Context, st checkpoints.Store, folder string) ([]RankStack, error) {
	prefix := folder + "/" + checkpoints.StacksDir + "/"
	names, err := st.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []RankStack
	for _, n := range names {
		if !strings.HasSuffix(n, ".txt") {
			continue
		}
		b, err := st.Read(ctx, n, maxLog)
		if errors.Is(err, checkpoints.ErrNotFound) {
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, ParseStacks(checkpoints.StacksDir+"/"+path.Base(n), string(b)))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out, nil
}

// Outside is the ranks whose main thread waits outside any collective
// while others wait in one: those the others wait for. Nil when every
// rank waits alike.
func Outside(stacks []RankStack) []int {
	var in, out []int
	for _, s := range stacks {
		if s.Where == "" {
			continue
		}
		if s.InCollective {
			in = append(in, s.Rank)
		} else {
			out = append(out, s.Rank)
		}
	}
	if len(in) == 0 {
		return nil
	}
	return out
}

// stalled is the Stalled cause, with where the ranks waited when their
// stacks are in: the rank the others waited for first (when one waited
// outside the collective they waited in), then every rank's wait.
func stalled(in Input) Cause {
	c := Cause{Kind: string(Stalled), Rank: -1}
	if len(in.Stacks) == 0 {
		return c
	}
	c.Source = checkpoints.StacksDir + "/"
	outside := Outside(in.Stacks)
	for _, s := range in.Stacks {
		line := fmt.Sprintf("rank %d: %s", s.Rank, s.Where)
		if len(outside) == 1 && s.Rank == outside[0] {
			c.Rank, c.Lines = s.Rank, append([]string{line}, c.Lines...)
			continue
		}
		c.Lines = append(c.Lines, line)
	}
	return c
}
