package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"
)

// lmResult is one successful LMCache poll.
type lmResult struct {
	at        time.Time
	occupancy float64
	available bool
}

// maxLMBody bounds an LMCache response body.
const maxLMBody = 64 << 10

// poll GETs the provider's LMCache endpoint every Refresh until ctx ends,
// handing each success to run's goroutine. Failures are counted and
// logged; the last value then ages into staleness.
func (k *worker) poll(ctx context.Context) {
	lm := k.spec.LM
	client := &http.Client{Timeout: min(max(lm.Refresh, 500*time.Millisecond), 5*time.Second)}
	defer client.CloseIdleConnections()
	for {
		res, reason, err := pollLMCache(ctx, client, lm.Endpoint)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			k.w.metrics.LMFailures.WithLabelValues(k.name, reason).Inc()
			k.log.Debug("lmcache poll failed", "endpoint", lm.Endpoint, "err", err)
		} else {
			k.w.metrics.LMRefreshes.WithLabelValues(k.name).Inc()
			select {
			case k.lm <- res:
			case <-ctx.Done():
				return
			}
		}
		if !sleep(ctx, lm.Refresh) {
			return
		}
	}
}

// pollLMCache fetches {"occupancy": f, "cache_available": b} (available
// defaults to true); occupancy is clamped to [0, 1]. On failure it returns
// the reason label: request, status, body or value.
func pollLMCache(ctx context.Context, client *http.Client, endpoint string) (lmResult, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return lmResult{}, "request", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return lmResult{}, "request", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxLMBody+1))
	if err != nil {
		return lmResult{}, "request", err
	}
	if resp.StatusCode/100 != 2 {
		return lmResult{}, "status", fmt.Errorf("status %d", resp.StatusCode)
	}
	if len(body) > maxLMBody {
		return lmResult{}, "body", errors.New("body too large")
	}
	return parseLMCache(body)
}

// parseLMCache reads an occupancy answer's body; on failure it returns the
// reason label: body (not the JSON object) or value (no finite occupancy).
func parseLMCache(body []byte) (lmResult, string, error) {
	var v struct {
		Occupancy      *float64 `json:"occupancy"`
		CacheAvailable *bool    `json:"cache_available"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return lmResult{}, "body", err
	}
	if v.Occupancy == nil || math.IsNaN(*v.Occupancy) || math.IsInf(*v.Occupancy, 0) {
		return lmResult{}, "value", errors.New("no finite occupancy")
	}
	res := lmResult{at: time.Now(), occupancy: min(max(*v.Occupancy, 0), 1), available: true}
	if v.CacheAvailable != nil {
		res.available = *v.CacheAvailable
	}
	return res, "", nil
}
