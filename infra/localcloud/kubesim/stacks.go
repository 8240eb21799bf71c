package kubesim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// The stacks a hung run's ranks write when the monitor asks
// (trainer/heartbeat.py): the rank that hung waits on a read in its data
// loader, outside any collective; every other rank waits in the all-reduce
// of the step it cannot finish without it. Simulated: the frames are
// shaped as Python's traceback prints them for those waits in the
// trainer's stack (Ray Train, transformers, accelerate, torch, fsspec),
// not read from a process. The played ranks answer the monitor's request
// only; the trainer's ranks also write theirs unasked when their own step
// stalls.

const site = "/home/ray/anaconda3/lib/python3.11/site-packages"

// frames are a stack, outermost first: "file:line:function:code".
func stackLines(frames ...string) []string {
	var out []string
	for _, f := range frames {
		parts := strings.SplitN(f, ":", 4)
		out = append(out, fmt.Sprintf("  File %q, line %s, in %s", strings.Replace(parts[0], "$", site, 1), parts[1], parts[2]), "    "+parts[3])
	}
	return out
}

var (
	// trainStep is a rank's main thread into transformers' training loop.
	trainStep = []string{
		"$/ray/train/_internal/worker_group.py:33:__execute:raise skipped from exception_cause(skipped)",
		"$/ray/train/_internal/utils.py:176:discard_return_wrapper:train_func(*args, **kwargs)",
		"/code/worker.py:378:train_func:_train(config, rank, beat)",
		"/code/worker.py:491:_train:trainer.train(resume_from_checkpoint=resume_dir)",
		"$/transformers/trainer.py:2238:train:return inner_training_loop(",
	}
	// inAllReduce waits for the step's all-reduce.
	inAllReduce = []string{
		"$/transformers/trainer.py:2582:_inner_training_loop:tr_loss_step = self.training_step(model, inputs, num_items_in_batch)",
		"$/transformers/trainer.py:3845:training_step:self.accelerator.backward(loss, **kwargs)",
		"$/accelerate/accelerator.py:2473:backward:self.reduce(loss, reduction=\"mean\")",
		"$/accelerate/utils/operations.py:770:reduce:return recursively_apply(_reduce_across_processes, tensor, error_on_other_type=True, reduction=reduction)",
		"$/accelerate/utils/operations.py:763:_reduce_across_processes:torch.distributed.all_reduce(cloned_tensor, ReduceOp.SUM)",
		"$/torch/distributed/c10d_logger.py:81:wrapper:return func(*args, **kwargs)",
		"$/torch/distributed/distributed_c10d.py:2810:all_reduce:work.wait()",
	}
	// inDataRead waits for an image the data loader reads from the bucket.
	inDataRead = []string{
		"$/transformers/trainer.py:2527:_inner_training_loop:batch_samples, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches, args.device)",
		"$/transformers/trainer.py:5339:get_batch_samples:batch_samples.append(next(epoch_iterator))",
		"$/accelerate/data_loader.py:567:__iter__:next_batch = next(dataloader_iter)",
		"$/torch/utils/data/dataloader.py:733:__next__:data = self._next_data()",
		"$/torch/utils/data/dataloader.py:789:_next_data:data = self._dataset_fetcher.fetch(index)  # may raise StopIteration",
		"$/torch/utils/data/_utils/fetch.py:52:fetch:data = self.dataset.__getitems__(possibly_batched_index)",
		"/code/data.py:402:__getitems__:return [self._row(i) for i in indices]",
		"/code/data.py:318:_image:return Image.open(io.BytesIO(fs.cat_file(path)))",
		"$/fsspec/asyn.py:118:wrapper:return sync(self.loop, func, *args, **kwargs)",
		"$/fsspec/asyn.py:91:sync:if event.wait(1):",
		"/home/ray/anaconda3/lib/python3.11/threading.py:629:wait:signaled = self._cond.wait(timeout)",
		"/home/ray/anaconda3/lib/python3.11/threading.py:331:wait:gotit = waiter.acquire(True, timeout)",
	}
	// beating is the heartbeat thread itself, writing the stacks.
	beating = []string{
		"/home/ray/anaconda3/lib/python3.11/threading.py:1002:_bootstrap:self._bootstrap_inner()",
		"/home/ray/anaconda3/lib/python3.11/threading.py:1045:_bootstrap_inner:self.run()",
		"/home/ray/anaconda3/lib/python3.11/threading.py:982:run:self._target(*self._args, **self._kwargs)",
		"/code/heartbeat.py:312:_serve:self.look()",
		"/code/heartbeat.py:236:look:self.dump(why)",
		"/code/heartbeat.py:283:dump:text = stacks_text(header)",
		"/code/heartbeat.py:97:stacks_text:out.extend(line.rstrip(\"\\n\") for line in traceback.format_stack(frame))",
	}
)

// rankStacks is the text of rank's stacks as trainer/heartbeat.py writes
// it, the rank that hung (hung) waiting on its data, the others in the
// all-reduce.
func rankStacks(rank int, hung bool, b checkpoints.Beat, why string, now time.Time) string {
	activityAt := now
	if b.ActivityAt != nil {
		activityAt = time.Unix(0, int64(*b.ActivityAt*1e9))
	}
	out := []string{
		fmt.Sprintf("raydrop stacks of rank %d, pid %d on %s, at %s: %s", rank, 4242+rank, "raydrop-worker", now.UTC().Format("2006-01-02T15:04:05Z"), why),
		fmt.Sprintf("last step %d, %s since %s UTC", b.Step, b.Activity, activityAt.UTC().Format(time.TimeOnly)),
		"",
		fmt.Sprintf(`Thread %#x "MainThread" (most recent call last):`, 0x7f3c9a2b5740+rank),
	}
	main := append([]string{}, trainStep...)
	if hung {
		main = append(main, inDataRead...)
	} else {
		main = append(main, inAllReduce...)
	}
	out = append(out, stackLines(main...)...)
	out = append(out, "", fmt.Sprintf(`Thread %#x "raydrop-heartbeat" (most recent call last):`, 0x7f3c7d5fe640+rank))
	out = append(out, stackLines(beating...)...)
	return strings.Join(out, "\n") + "\n\n"
}

// answer writes every rank's stacks once the monitor has asked for them
// (checkpoints.StacksRequest), once per request, to the attempt's
// evidence folder (or beside the heartbeats without one).
func (h *heart) answer(ctx context.Context) {
	exp := h.t.a.experimentName()
	b, err := h.t.st.get(ctx, h.t.a.bucket, checkpoints.StacksRequestName(exp))
	if err != nil {
		return // none yet (or not readable now: the next beat looks again)
	}
	var ask checkpoints.StacksAsk
	if json.Unmarshal(b, &ask) != nil || ask.ID == h.answered {
		return
	}
	h.answered = ask.ID
	bucket, folder := h.t.a.bucket, exp+"/"+checkpoints.HeartbeatDir+"/"
	if ev := h.t.p.snapshot().Evidence; ev != "" {
		if eb, name, ok := splitGS(ev); ok {
			bucket, folder = eb, strings.TrimSuffix(name, "/")+"/"
		}
	}
	h.mu.Lock()
	beat := h.beat
	h.mu.Unlock()
	now := time.Now()
	why := strings.TrimSuffix("asked by the monitor: "+ask.Why, ": ")
	hung := -1
	if h.t.sc.Outcome == Hang {
		hung = h.t.failingRank()
	}
	for rank := range h.t.a.numWorkers {
		text := rankStacks(rank, rank == hung, beat, why, now)
		if err := h.t.st.put(ctx, bucket, checkpoints.StacksName(folder, rank), []byte(text)); err != nil && ctx.Err() == nil {
			h.t.p.log().Info("stacks not written", "rank", rank, "err", err)
		}
	}
	h.t.p.log().Info("ranks' stacks written", "request", ask.ID, "folder", "gs://"+bucket+"/"+folder)
}
