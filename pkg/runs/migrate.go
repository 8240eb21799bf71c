package runs

import (
	"context"
	"errors"
	"fmt"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/gcsdoc"
)

// StatePrefixes are the folders of the pipeline's state: run records,
// cluster leases, sweeps, and the model staging leases.
var StatePrefixes = []string{Prefix, "clusters/", "sweeps/", "staging/"}

// MigrateState copies the state objects (StatePrefixes) of a deployment
// made before the state bucket existed from its intake bucket to the state
// bucket, each only if the state bucket has no object of that name yet (the
// functions may have written a newer one). Custom metadata is copied with
// the object. It returns how many it copied and how many were there.
func MigrateState(ctx context.Context, from, to *storage.BucketHandle) (copied, present int, err error) {
	for _, prefix := range StatePrefixes {
		it := from.Objects(ctx, &storage.Query{Prefix: prefix})
		for {
			a, err := it.Next()
			if errors.Is(err, iterator.Done) {
				break
			}
			if err != nil {
				return copied, present, fmt.Errorf("list %s: %w", prefix, err)
			}
			// Look first, and copy only if absent: the precondition keeps a
			// function's write that lands in between.
			_, err = to.Object(a.Name).Attrs(ctx)
			switch {
			case err == nil:
				present++
				continue
			case !errors.Is(err, storage.ErrObjectNotExist):
				return copied, present, fmt.Errorf("look up %s: %w", a.Name, err)
			}
			_, err = to.Object(a.Name).If(storage.Conditions{DoesNotExist: true}).CopierFrom(from.Object(a.Name)).Run(ctx)
			switch {
			case gcsdoc.IsPrecondition(err):
				present++
			case err != nil:
				return copied, present, fmt.Errorf("copy %s: %w", a.Name, err)
			default:
				copied++
			}
		}
	}
	return copied, present, nil
}
