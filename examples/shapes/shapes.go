// Package shapes makes a small vision dataset in Hugging Face's ImageFolder
// layout, the layout a user's own bucket of images most often has: PNG
// images under images/ and a metadata.jsonl whose file_name column names
// each row's image, beside columns of the user's own (question, answer,
// shape, colour, position). Each image is one circle, square or triangle of
// one colour on a white background, so every answer can be checked against
// the drawing. The local cloud uploads it to its data bucket, where
// examples/shapes.json fine-tunes on it.
package shapes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
)

// Folder is the dataset's folder in the data bucket.
const Folder = "shapes"

// Size is the width and height of every image, in pixels.
const Size = 64

// MaxImages is the most images Files makes: file names have four digits.
const MaxImages = 10000

// Shapes are the shapes drawn, as the answers name them.
var Shapes = []string{"circle", "square", "triangle"}

// Colours are the colours drawn, by the name the answers use.
var Colours = map[string]color.RGBA{
	"red":    {R: 220, G: 30, B: 30, A: 255},
	"green":  {R: 30, G: 160, B: 60, A: 255},
	"blue":   {R: 30, G: 70, B: 220, A: 255},
	"yellow": {R: 240, G: 200, B: 20, A: 255},
}

// colourNames is Colours' keys in a fixed order, so a seed draws the same
// colours on every run.
var colourNames = []string{"red", "green", "blue", "yellow"}

// Positions are the quarters of the picture a shape is drawn in, as the
// answers name them, in the order left-right, top-bottom.
var Positions = []string{"top left", "top right", "bottom left", "bottom right"}

// The questions asked, one per row, drawn at random.
const (
	AskShapeAndColour = "What shape is in the picture, and what colour is it?"
	AskColour         = "What colour is the shape?"
	AskPosition       = "Where is the shape: top left, top right, bottom left or bottom right?"
)

// Row is one line of metadata.jsonl. FileName is ImageFolder's column; the
// trainer reads it as the image column "image". The others are the
// dataset's own columns: the spec's template names them.
type Row struct {
	FileName string `json:"file_name"`
	Question string `json:"question"`
	Answer   string `json:"answer"`
	Shape    string `json:"shape"`
	Colour   string `json:"colour"`
	Position string `json:"position"`
	// X and Y are the shape's centre, and Radius half its width, in
	// pixels: a circle's radius, half a square's side, half a triangle's
	// base and height.
	X      int `json:"x"`
	Y      int `json:"y"`
	Radius int `json:"radius"`
}

// Rows draws n rows' shapes, colours, positions and questions from seed;
// the same n and seed give the same rows.
func Rows(n int, seed int64) ([]Row, error) {
	if n < 1 || n > MaxImages {
		return nil, fmt.Errorf("%d images: give 1 to %d", n, MaxImages)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	rows := make([]Row, n)
	for i := range rows {
		r := Row{
			FileName: fmt.Sprintf("images/%04d.png", i),
			Shape:    Shapes[rng.IntN(len(Shapes))],
			Colour:   colourNames[rng.IntN(len(colourNames))],
			Radius:   6 + rng.IntN(7), // 6 to 12: 13 to 25 pixels across
		}
		// The whole shape lies inside its quarter, one pixel clear of
		// the quarter's edges, so its position is never in doubt.
		q := rng.IntN(len(Positions))
		r.Position = Positions[q]
		half := Size / 2
		x0, y0 := (q%2)*half, (q/2)*half
		span := half - 2*r.Radius - 2
		r.X = x0 + r.Radius + 1 + rng.IntN(span)
		r.Y = y0 + r.Radius + 1 + rng.IntN(span)
		switch rng.IntN(3) {
		case 0:
			r.Question, r.Answer = AskShapeAndColour, fmt.Sprintf("A %s %s.", r.Colour, r.Shape)
		case 1:
			r.Question, r.Answer = AskColour, capitalise(r.Colour)+"."
		default:
			r.Question, r.Answer = AskPosition, capitalise(r.Position)+"."
		}
		rows[i] = r
	}
	return rows, nil
}

// Files returns the dataset's n images and its metadata.jsonl, by object
// name relative to the dataset's folder: metadata.jsonl and
// images/0000.png to images/NNNN.png.
func Files(n int, seed int64) (map[string][]byte, error) {
	rows, err := Rows(n, seed)
	if err != nil {
		return nil, err
	}
	files := make(map[string][]byte, n+1)
	var meta bytes.Buffer
	for _, r := range rows {
		line, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		meta.Write(line)
		meta.WriteByte('\n')
		var img bytes.Buffer
		if err := png.Encode(&img, Draw(r)); err != nil {
			return nil, fmt.Errorf("encode %s: %w", r.FileName, err)
		}
		files[r.FileName] = img.Bytes()
	}
	files["metadata.jsonl"] = meta.Bytes()
	return files, nil
}

// Draw paints r's shape in r's colour on a white Size x Size picture. A
// triangle points up: its apex is Radius above the centre and its base
// Radius below, 2*Radius+1 pixels wide.
func Draw(r Row) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, Size, Size))
	ink := Colours[r.Colour]
	white := color.RGBA{R: 255, G: 255, B: 255, A: 255}
	for y := range Size {
		for x := range Size {
			c := white
			if inside(r, x-r.X, y-r.Y) {
				c = ink
			}
			img.SetRGBA(x, y, c)
		}
	}
	return img
}

// inside reports whether the pixel dx, dy from the centre is part of r's
// shape.
func inside(r Row, dx, dy int) bool {
	k := r.Radius
	switch r.Shape {
	case "circle":
		return dx*dx+dy*dy <= k*k
	case "square":
		return abs(dx) <= k && abs(dy) <= k
	case "triangle":
		// Rows from the apex (dy = -k) down to the base (dy = k),
		// widening by one pixel each side every two rows.
		return dy >= -k && dy <= k && 2*abs(dx) <= dy+k
	}
	return false
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func capitalise(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
