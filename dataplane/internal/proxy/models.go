package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"rolter.dev/pkg/config"
)

// GET /v1/models and GET /v1/models/{id} exist in both APIs with different
// shapes; the answer takes the caller's (clientDialect). Both list the same
// models, in route-table order, filtered by the key in the same way.

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// anthropicModel is Anthropic's ModelInfo, with the fields a route has.
type anthropicModel struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

// anthropicModelList is Anthropic's page of models. first_id and last_id
// are null on an empty page, as Anthropic sends them.
type anthropicModelList struct {
	Data    []anthropicModel `json:"data"`
	HasMore bool             `json:"has_more"`
	FirstID *string          `json:"first_id"`
	LastID  *string          `json:"last_id"`
}

// newModelEntry is a route as an OpenAI model object. Created is 0: a
// route has no creation time (Anthropic's SDKs document an epoch value
// for "unknown").
func newModelEntry(id string) modelEntry {
	return modelEntry{ID: id, Object: "model", OwnedBy: "rolter"}
}

// anthropicModelOf is the same model in Anthropic's shape. The config has
// no display name, so the id is it.
func anthropicModelOf(e modelEntry) anthropicModel {
	return anthropicModel{Type: "model", ID: e.ID, DisplayName: e.ID, CreatedAt: time.Unix(e.Created, 0).UTC().Format(time.RFC3339)}
}

// listedModels is what /v1/models shows the key: the routes in config
// order, less those the key may not use.
func listedModels(rt *runtime, key *config.Key) []string {
	var ids []string
	for _, m := range rt.modelNames() {
		if keyMayUse(key, m) {
			ids = append(ids, m)
		}
	}
	return ids
}

// keyMayUse reports whether key (nil: no key, authentication off) may use
// model: what decides, for both paths, whether a model exists for it.
func keyMayUse(key *config.Key, model string) bool { return key == nil || key.AllowsModel(model) }

// modelsCaller is what both models paths start with: the caller's dialect,
// the configuration and the caller's key; false when it answered already
// (no configuration yet, a key refused).
func (p *Proxy) modelsCaller(w http.ResponseWriter, r *http.Request) (dialect, *runtime, *config.Key, bool) {
	d := clientDialect(r)
	rt := p.rt.Load()
	if rt == nil {
		writeError(w, d, errNoTarget, "no configuration loaded yet")
		return d, nil, nil, false
	}
	key, aerr, msg := p.authenticate(rt, r)
	if aerr != nil {
		writeError(w, d, *aerr, msg)
		return d, nil, nil, false
	}
	return d, rt, key, true
}

func (p *Proxy) serveModels(w http.ResponseWriter, r *http.Request) {
	d, rt, key, ok := p.modelsCaller(w, r)
	if !ok {
		return
	}
	ids := listedModels(rt, key)
	var body any
	if d == dialectAnthropic {
		pg, err := parseModelPage(r.URL.RawQuery)
		if err != nil {
			writeError(w, d, errInvalidRequest, err.Error())
			return
		}
		page, hasMore, err := pg.window(ids)
		if err != nil {
			writeError(w, d, errInvalidRequest, err.Error())
			return
		}
		list := anthropicModelList{Data: make([]anthropicModel, 0, len(page)), HasMore: hasMore}
		for _, id := range page {
			list.Data = append(list.Data, anthropicModelOf(newModelEntry(id)))
		}
		if len(page) > 0 {
			list.FirstID, list.LastID = &page[0], &page[len(page)-1]
		}
		body = list
	} else {
		list := modelList{Object: "list", Data: make([]modelEntry, 0, len(ids))}
		for _, id := range ids {
			list.Data = append(list.Data, newModelEntry(id))
		}
		body = list
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// serveModel answers GET /v1/models/{id} from the route table, filtered by
// the key as the list is: a model the key may not use does not exist for it.
func (p *Proxy) serveModel(w http.ResponseWriter, r *http.Request, id string) {
	d, rt, key, ok := p.modelsCaller(w, r)
	if !ok {
		return
	}
	if rt.routes[id] == nil || !keyMayUse(key, id) {
		writeError(w, d, errModelNotFound, fmt.Sprintf("The model %q does not exist", echoedName(id)))
		return
	}
	var body any = newModelEntry(id)
	if d == dialectAnthropic {
		body = anthropicModelOf(newModelEntry(id))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// Anthropic's bounds and default for the limit query parameter.
const (
	modelPageDefault = 20
	modelPageMax     = 1000
)

// modelPage is the page of the model list an Anthropic client asks for:
// at most limit models after afterID, or before beforeID, or from the
// start when neither is given.
type modelPage struct {
	limit             int
	afterID, beforeID string
}

// parseModelPage reads limit, after_id and before_id from a query string
// (outside input). Other parameters (lifecycle, which every route passes
// as "active") are ignored.
func parseModelPage(rawQuery string) (modelPage, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return modelPage{}, fmt.Errorf("malformed query string: %w", err)
	}
	pg := modelPage{limit: modelPageDefault, afterID: q.Get("after_id"), beforeID: q.Get("before_id")}
	if q.Has("limit") {
		s := q.Get("limit")
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > modelPageMax {
			return modelPage{}, fmt.Errorf("limit: must be an integer from 1 to %d, got %q", modelPageMax, s)
		}
		pg.limit = n
	}
	if pg.afterID != "" && pg.beforeID != "" {
		// Anthropic documents no meaning for both; refusing beats guessing.
		return modelPage{}, errors.New("after_id and before_id: give at most one")
	}
	return pg, nil
}

// window returns the models of the page and whether more lie beyond it in
// the direction asked (Anthropic's has_more: after the page when paging
// forward, before it when paging back with before_id). A cursor not in
// ids is an error rather than an empty page, so that a client paging
// across a reload that removed its cursor model learns it, instead of
// taking a truncated list for the whole; a model the key may not use is
// not in ids, so the answer reveals nothing about it.
func (pg modelPage) window(ids []string) (page []string, hasMore bool, err error) {
	switch {
	case pg.afterID != "":
		i := slices.Index(ids, pg.afterID)
		if i < 0 {
			return nil, false, fmt.Errorf("after_id: no model %q in the list", pg.afterID)
		}
		rest := ids[i+1:]
		n := min(pg.limit, len(rest))
		return rest[:n], n < len(rest), nil
	case pg.beforeID != "":
		i := slices.Index(ids, pg.beforeID)
		if i < 0 {
			return nil, false, fmt.Errorf("before_id: no model %q in the list", pg.beforeID)
		}
		start := max(0, i-pg.limit)
		return ids[start:i], start > 0, nil
	}
	n := min(pg.limit, len(ids))
	return ids[:n], n < len(ids), nil
}
