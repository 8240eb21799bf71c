package kubesim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
)

func TestParseScenario(t *testing.T) {
	sc, err := kubesim.ParseScenario("outcome=fail,at=5,steps=3,step=100ms,pending=1s,pull=3s,env=4s,weights=5s,data=6s,dropped=2,refuse=reservation:20s/spot")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Outcome != kubesim.Fail || sc.At != 5 || sc.StepsPerEpoch != 3 || sc.StepTime != 100*time.Millisecond ||
		sc.PendingFor != time.Second || sc.Pull != 3*time.Second || sc.Env != 4*time.Second || sc.Weights != 5*time.Second || sc.Data != 6*time.Second || sc.DroppedRows != 2 || sc.Refuse["reservation"] != 20*time.Second || sc.Refuse["spot"] != 0 || len(sc.Refuse) != 2 {
		t.Errorf("parsed %+v", sc)
	}
	if oom, err := kubesim.ParseScenario("outcome=cuda-oom,at=3,rank=5"); err != nil || oom.Outcome != kubesim.CudaOOM || oom.Rank == nil || *oom.Rank != 5 {
		t.Errorf("outcome=cuda-oom,at=3,rank=5: %+v, %v", oom, err)
	}
	if d, err := kubesim.ParseScenario(" "); err != nil || d.Outcome != kubesim.DefaultScenario().Outcome {
		t.Errorf("blank: %+v, %v", d, err)
	}
	for text, want := range map[string]string{
		"colour=red":            "unknown key",
		"at=five":               `"at=five"`,
		"refuse=cheap":          "unknown capacity tier",
		"refuse=spot:-1s":       "not a positive duration",
		"preempt=3/0":           "not a step",
		"preempt=3,preemptAs=x": "allowed: preempt",
		"outcome=explode":       "allowed: succeed, fail",
		"rank=-1":               "a rank is 0 or more",
		"outcome=hang,hangs=0":  "1 or more",
	} {
		if _, err := kubesim.ParseScenario(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", text, err, want)
		}
	}
}

func TestScenarioForAttempt(t *testing.T) {
	lose, _ := kubesim.ParseScenario("outcome=lose-head,at=3")
	if lose.ForAttempt(1).Outcome != kubesim.LoseHead || lose.ForAttempt(2).Outcome != kubesim.Succeed {
		t.Errorf("a lost head is a one-off: attempt 1 %s, attempt 2 %s", lose.ForAttempt(1).Outcome, lose.ForAttempt(2).Outcome)
	}
	hang, _ := kubesim.ParseScenario("outcome=hang,at=3,hangs=1")
	if hang.ForAttempt(1).Outcome != kubesim.Hang || hang.ForAttempt(2).Outcome != kubesim.Succeed {
		t.Errorf("hangs=1: attempt 1 %s, attempt 2 %s", hang.ForAttempt(1).Outcome, hang.ForAttempt(2).Outcome)
	}
	always, _ := kubesim.ParseScenario("outcome=hang,at=3")
	if always.ForAttempt(3).Outcome != kubesim.Hang {
		t.Errorf("without hangs every attempt hangs: attempt 3 %s", always.ForAttempt(3).Outcome)
	}
	pre, _ := kubesim.ParseScenario("preempt=3/7,preemptAs=reclaim")
	for n, want := range map[int]struct {
		o  kubesim.Outcome
		at int
	}{1: {kubesim.Reclaim, 3}, 2: {kubesim.Reclaim, 7}, 3: {kubesim.Succeed, 0}} {
		got := pre.ForAttempt(n)
		if got.Outcome != want.o || want.at != 0 && got.At != want.at {
			t.Errorf("attempt %d plays %s at %d, want %s at %d", n, got.Outcome, got.At, want.o, want.at)
		}
	}
}
