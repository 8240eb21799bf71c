package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/examples/shapes"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/spec"
)

func readSpec(t *testing.T, file string) *spec.JobSpec {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return s
}

// TestShapesSpecReadsTheUpload: examples/shapes.json trains on the folder
// the local cloud uploads, and writes to the output bucket the local cloud
// allows (the default spec's, which make run and make dev start with).
func TestShapesSpecReadsTheUpload(t *testing.T) {
	s := readSpec(t, "../../../../examples/shapes.json")
	if want := "gs://" + stack.DataBucket + "/" + shapes.Folder; s.Dataset.Source != want {
		t.Errorf("examples/shapes.json reads %s, the local cloud uploads to %s", s.Dataset.Source, want)
	}
	def := readSpec(t, "../../../../examples/gemma3-vision.json")
	if s.Output.Bucket != def.Output.Bucket {
		t.Errorf("examples/shapes.json writes to %s, the local cloud allows %s", s.Output.Bucket, def.Output.Bucket)
	}
}

// TestUploadShapes uploads the dataset to an in-process fake-gcs-server and
// reads every object back.
func TestUploadShapes(t *testing.T) {
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", Writer: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: stack.DataBucket})
	gcs := srv.Client()
	ctx := context.Background()

	var out bytes.Buffer
	if err := uploadShapes(ctx, gcs, &out); err != nil {
		t.Fatal(err)
	}
	if line := out.String(); !strings.Contains(line, "gs://raydrop-local-data/shapes/") || !strings.Contains(line, "300 images") {
		t.Errorf("progress line %q names neither the folder nor the images", line)
	}
	want, err := shapes.Files(shapesImages, shapesSeed)
	if err != nil {
		t.Fatal(err)
	}
	it := gcs.Bucket(stack.DataBucket).Objects(ctx, &storage.Query{Prefix: shapes.Folder + "/"})
	got := 0
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		got++
		name := strings.TrimPrefix(a.Name, shapes.Folder+"/")
		rd, err := gcs.Bucket(stack.DataBucket).Object(a.Name).NewReader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(rd)
		_ = rd.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, want[name]) {
			t.Errorf("%s: %d bytes differ from the dataset's %d", a.Name, len(data), len(want[name]))
		}
	}
	if got != len(want) {
		t.Errorf("%d objects under %s/, want %d", got, shapes.Folder, len(want))
	}
}
