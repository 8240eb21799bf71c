package kubesim

import (
	"math"
	"testing"
)

// TestCurveFollowsTheHyperparameters: the simulated held-out loss is
// lowest at the spec's defaults (learning rate 2e-4, rank 16), higher the
// further either moves, reproducible for a seed, and exactly the default
// curve at the defaults.
func TestCurveFollowsTheHyperparameters(t *testing.T) {
	at := func(lr float64, r, seed int) curve {
		return (&trainer{a: &trainerArgs{learningRate: lr, loraR: r, seed: seed}}).curve()
	}
	base := at(2e-4, 16, 42)
	if base != (curve{floor: 0, scale: 1, offset: 0}) {
		t.Fatalf("the defaults' curve is %+v", base)
	}
	if got, want := base.evalLoss(20), math.Round((0.45+2.2*math.Exp(-2))*1e4)/1e4; got != want {
		t.Errorf("default held-out loss at step 20: %g, want %g", got, want)
	}
	const late = 60
	for _, c := range []struct {
		name string
		cv   curve
	}{{"lr 2e-3", at(2e-3, 16, 42)}, {"lr 2e-5", at(2e-5, 16, 42)}, {"rank 64", at(2e-4, 64, 42)}, {"rank 2", at(2e-4, 2, 42)}} {
		if c.cv.evalLoss(late) <= base.evalLoss(late) {
			t.Errorf("%s ends at %g, not above the defaults' %g", c.name, c.cv.evalLoss(late), base.evalLoss(late))
		}
	}
	if fast, slow := at(8e-4, 16, 42), at(5e-5, 16, 42); fast.loss(4) >= slow.loss(4) {
		t.Errorf("a higher learning rate does not fall faster early: %g vs %g", fast.loss(4), slow.loss(4))
	}
	a, b := at(2e-4, 16, 7), at(2e-4, 16, 7)
	if a != b || a.offset == 0 || math.Abs(a.offset) > 0.01 {
		t.Errorf("seed 7: %+v, %+v", a, b)
	}
}
