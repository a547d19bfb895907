package sim

import (
	"fmt"
	"image/color"
	"io"
	"math"
)

// Chart geometry, in pixels.
const (
	chartRow     = 22
	chartLabelW  = 250
	chartPanelW  = 330
	chartGap     = 30
	chartTop     = 64
	chartBottom  = 30
	chartBarH    = 14
	chartPadding = 12
)

var (
	colText   = color.RGBA{20, 20, 20, 255}
	colGrid   = color.RGBA{225, 225, 225, 255}
	colHit    = color.RGBA{52, 120, 198, 255}
	colRolter = color.RGBA{214, 96, 40, 255}
	colPeer   = color.RGBA{120, 120, 120, 255}
	colOracle = color.RGBA{40, 150, 80, 255}
	colLimit  = color.RGBA{200, 30, 30, 255}
)

// WriteChart draws a PNG comparing the strategies of results (one workload):
// token hit rate bars on the left, load imbalance bars on the right (a red
// line marks 1.25). cache_aware variants are orange, peers grey, the oracle
// green. title goes on top.
func WriteChart(w io.Writer, title string, results []Result) error {
	if len(results) == 0 {
		return fmt.Errorf("chart: no results")
	}
	width := chartLabelW + 2*chartPanelW + chartGap + 2*chartPadding
	height := chartTop + len(results)*chartRow + chartBottom
	cv := NewCanvas(width, height)
	text, textW, rect := cv.Text, cv.TextWidth, cv.Rect

	text(chartPadding, 18, title, colText)
	left := chartPadding + chartLabelW
	right := left + chartPanelW + chartGap
	text(left, 44, "token prefix-cache hit rate (%)", colText)
	text(right, 44, "load imbalance (max/mean busy time)", colText)

	maxImb := 1.5
	for _, r := range results {
		maxImb = max(maxImb, r.LoadImbalance)
	}
	step := 0.5 // imbalance grid step: at most 6 lines
	for maxImb/step > 6 {
		step *= 2
	}
	maxImb = step * math.Ceil(maxImb/step+1e-9)
	plotTop, plotBottom := chartTop-8, chartTop+len(results)*chartRow
	for i := 0; i <= 4; i++ { // grid every 25 %
		x := left + i*(chartPanelW-60)/4
		rect(x, plotTop, x+1, plotBottom, colGrid)
		text(x-6, plotBottom+14, fmt.Sprint(i*25), colText)
	}
	scaleImb := func(v float64) int { return right + int(v/maxImb*float64(chartPanelW-60)) }
	for v := 0.0; v <= maxImb+1e-9; v += step {
		x := scaleImb(v)
		rect(x, plotTop, x+1, plotBottom, colGrid)
		text(x-8, plotBottom+14, fmt.Sprintf("%.1f", v), colText)
	}
	limit := scaleImb(1.25)
	rect(limit, plotTop, limit+2, plotBottom, colLimit)

	for i, r := range results {
		y := chartTop + i*chartRow
		label := r.Strategy
		for textW(label) > chartLabelW-8 && len(label) > 4 {
			label = label[:len(label)-4] + "..."
		}
		text(left-8-textW(label), y+11, label, colText)
		c := colHit
		switch base := baseName(r.Strategy); {
		case base == Clairvoyant:
			c = colOracle
		case isPeer(base):
			c = colPeer
		case base == "cache_aware":
			c = colRolter
		}
		hw := int(r.HitRate * float64(chartPanelW-60))
		rect(left, y, left+max(hw, 1), y+chartBarH, c)
		text(left+hw+4, y+11, fmt.Sprintf("%.1f", 100*r.HitRate), colText)
		iw := scaleImb(r.LoadImbalance)
		rect(right, y, max(iw, right+1), y+chartBarH, c)
		text(iw+4, y+11, fmt.Sprintf("%.2f", r.LoadImbalance), colText)
	}
	return cv.EncodePNG(w)
}

func baseName(strategy string) string {
	for i := range len(strategy) {
		if strategy[i] == ':' {
			return strategy[:i]
		}
	}
	return strategy
}

func isPeer(base string) bool {
	for _, p := range PeerStrategies {
		if p == base {
			return true
		}
	}
	return false
}
