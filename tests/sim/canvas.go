package sim

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Canvas is a white image with the drawing the simulator's charts use
// (WriteChart's and rolter-sim-grid's): text in a 7×13 bitmap font and
// filled boxes.
type Canvas struct {
	img  *image.RGBA
	face font.Face
}

// NewCanvas returns a white canvas of width × height pixels.
func NewCanvas(width, height int) *Canvas {
	c := &Canvas{img: image.NewRGBA(image.Rect(0, 0, width, height)), face: basicfont.Face7x13}
	draw.Draw(c.img, c.img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	return c
}

// Text draws s with its baseline starting at (x, y).
func (c *Canvas) Text(x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: c.face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// TextWidth is s's width in pixels.
func (c *Canvas) TextWidth(s string) int { return font.MeasureString(c.face, s).Round() }

// Rect fills the box [x0, x1) × [y0, y1).
func (c *Canvas) Rect(x0, y0, x1, y1 int, col color.Color) {
	draw.Draw(c.img, image.Rect(x0, y0, x1, y1), image.NewUniform(col), image.Point{}, draw.Src)
}

// EncodePNG writes the canvas as a PNG.
func (c *Canvas) EncodePNG(w io.Writer) error { return png.Encode(w, c.img) }
