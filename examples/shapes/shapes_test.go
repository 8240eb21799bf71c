package shapes_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"reflect"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/examples/shapes"
)

func TestFilesDeterministic(t *testing.T) {
	a, err := shapes.Files(50, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := shapes.Files(50, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("the same n and seed gave different files")
	}
	c, err := shapes.Files(50, 2)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a["metadata.jsonl"], c["metadata.jsonl"]) {
		t.Error("seeds 1 and 2 gave the same metadata")
	}
}

func TestFilesBadCount(t *testing.T) {
	for _, n := range []int{0, -1, shapes.MaxImages + 1} {
		if _, err := shapes.Files(n, 1); err == nil {
			t.Errorf("Files(%d) made a dataset", n)
		}
	}
}

// TestFiles reads each dataset back as a trainer would (metadata.jsonl,
// then each image it names) and checks every answer against what the
// image shows, measured from its pixels alone.
func TestFiles(t *testing.T) {
	for _, tc := range []struct {
		n    int
		seed int64
	}{{1, 1}, {12, 7}, {300, 1}} {
		t.Run(fmt.Sprintf("n=%d,seed=%d", tc.n, tc.seed), func(t *testing.T) {
			files, err := shapes.Files(tc.n, tc.seed)
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != tc.n+1 {
				t.Errorf("%d files, want %d images and metadata.jsonl", len(files), tc.n)
			}
			rows := readMetadata(t, files["metadata.jsonl"])
			if len(rows) != tc.n {
				t.Fatalf("%d metadata lines, want %d", len(rows), tc.n)
			}
			for i, r := range rows {
				if want := fmt.Sprintf("images/%04d.png", i); r["file_name"] != want {
					t.Errorf("line %d: file_name %q, want %q", i+1, r["file_name"], want)
				}
				data, ok := files[r["file_name"]]
				if !ok {
					t.Errorf("line %d: no file %s", i+1, r["file_name"])
					continue
				}
				img, err := png.Decode(bytes.NewReader(data))
				if err != nil {
					t.Errorf("%s: %v", r["file_name"], err)
					continue
				}
				seen, err := measure(img)
				if err != nil {
					t.Errorf("%s: %v", r["file_name"], err)
					continue
				}
				var want string
				switch r["question"] {
				case shapes.AskShapeAndColour:
					want = fmt.Sprintf("A %s %s.", seen.colour, seen.shape)
				case shapes.AskColour:
					want = title(seen.colour) + "."
				case shapes.AskPosition:
					want = title(seen.position) + "."
				default:
					t.Errorf("%s: unknown question %q", r["file_name"], r["question"])
				}
				if r["answer"] != want {
					t.Errorf("%s: answer %q, the image shows %q (%+v)", r["file_name"], r["answer"], want, seen)
				}
				if r["shape"] != seen.shape || r["colour"] != seen.colour || r["position"] != seen.position {
					t.Errorf("%s: columns %s %s %s, the image shows %+v", r["file_name"], r["shape"], r["colour"], r["position"], seen)
				}
				if got := fmt.Sprintf("x %s y %s radius %s", r["x"], r["y"], r["radius"]); got != seen.geometry() {
					t.Errorf("%s: columns %s, the image shows %s", r["file_name"], got, seen.geometry())
				}
			}
		})
	}
}

// TestFilesCoverEveryAnswer: 300 images, as the local cloud uploads, show
// every shape, colour, position and question.
func TestFilesCoverEveryAnswer(t *testing.T) {
	rows, err := shapes.Rows(300, 1)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rows {
		seen[r.Shape]++
		seen[r.Colour]++
		seen[r.Position]++
		seen[r.Question]++
	}
	want := append(append(append([]string{}, shapes.Shapes...), shapes.Positions...),
		shapes.AskShapeAndColour, shapes.AskColour, shapes.AskPosition)
	for c := range shapes.Colours {
		want = append(want, c)
	}
	for _, w := range want {
		if seen[w] < 10 {
			t.Errorf("%q in %d of 300 rows", w, seen[w])
		}
	}
}

func readMetadata(t *testing.T, data []byte) []map[string]string {
	t.Helper()
	var rows []map[string]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var raw map[string]any
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			t.Fatalf("metadata line %d: %v", len(rows)+1, err)
		}
		row := map[string]string{}
		for k, v := range raw {
			row[k] = fmt.Sprint(v)
		}
		rows = append(rows, row)
	}
	return rows
}

type drawing struct {
	shape, colour, position string
	box                     image.Rectangle
}

// measure finds what an image shows: the box around every pixel that is
// not white, the colour at its centre, the shape from the box's corners (a
// square fills them, a triangle pointing up fills only the bottom ones, a
// circle none) and the quarter the centre lies in.
func measure(img image.Image) (drawing, error) {
	var d drawing
	b := img.Bounds()
	if b.Dx() != shapes.Size || b.Dy() != shapes.Size {
		return d, fmt.Errorf("size %v, want %dx%d", b.Size(), shapes.Size, shapes.Size)
	}
	white := color.RGBA{R: 255, G: 255, B: 255, A: 255}
	at := func(x, y int) color.RGBA { return color.RGBAModel.Convert(img.At(x, y)).(color.RGBA) }
	first := true
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if at(x, y) == white {
				continue
			}
			p := image.Rect(x, y, x+1, y+1)
			if first {
				d.box, first = p, false
			} else {
				d.box = d.box.Union(p)
			}
		}
	}
	if first {
		return d, fmt.Errorf("a blank image")
	}
	cx, cy := (d.box.Min.X+d.box.Max.X-1)/2, (d.box.Min.Y+d.box.Max.Y-1)/2
	centre := at(cx, cy)
	for name, c := range shapes.Colours {
		if c == centre {
			d.colour = name
		}
	}
	if d.colour == "" {
		return d, fmt.Errorf("colour %v at the centre (%d, %d) is none of the palette's", centre, cx, cy)
	}
	corner := func(x, y int) bool { return at(x, y) == centre }
	top := corner(d.box.Min.X, d.box.Min.Y) && corner(d.box.Max.X-1, d.box.Min.Y)
	bottom := corner(d.box.Min.X, d.box.Max.Y-1) && corner(d.box.Max.X-1, d.box.Max.Y-1)
	switch {
	case top && bottom:
		d.shape = "square"
	case bottom:
		d.shape = "triangle"
	case !top:
		d.shape = "circle"
	default:
		return d, fmt.Errorf("corners of %v are no shape's", d.box)
	}
	half := shapes.Size / 2
	if (d.box.Min.X < half) != (d.box.Max.X <= half) || (d.box.Min.Y < half) != (d.box.Max.Y <= half) {
		return d, fmt.Errorf("shape %v crosses the middle", d.box)
	}
	d.position = map[bool]string{true: "top", false: "bottom"}[cy < half] + " " + map[bool]string{true: "left", false: "right"}[cx < half]
	return d, nil
}

// geometry is the centre and the half width of the box, as the columns x, y
// and radius give them.
func (d drawing) geometry() string {
	return fmt.Sprintf("x %d y %d radius %d", (d.box.Min.X+d.box.Max.X-1)/2, (d.box.Min.Y+d.box.Max.Y-1)/2, (d.box.Dx()-1)/2)
}

func title(s string) string { return strings.ToUpper(s[:1]) + s[1:] }
