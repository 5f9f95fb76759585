package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// classOf returns the index of the request's class in s.classes, the
// default class for an empty name.
func (s *Scheduler) classOf(name string) (int, bool) {
	if name == "" {
		return s.defClass, true
	}
	for i, c := range s.classes {
		if c.Name == name {
			return i, true
		}
	}
	return 0, false
}

// RequestedClass returns the class a request runs in when its API key
// grants granted (empty: the default) and it asks for asked (empty: no
// ask). A client may lower its priority, never raise it above its key's.
// An unknown ask is returned as is, for admission to refuse.
func (s *Scheduler) RequestedClass(granted, asked string) string {
	if asked == "" {
		return granted
	}
	a, ok := s.classOf(asked)
	if !ok {
		return asked
	}
	if g, ok := s.classOf(granted); ok && s.classes[a].Priority < s.classes[g].Priority {
		return granted
	}
	return asked
}

// maxWait returns the queueing deadline of the named class.
func (s *Scheduler) maxWait(class string) time.Duration {
	if i, ok := s.classOf(class); ok && s.classes[i].MaxQueueWait > 0 {
		return s.classes[i].MaxQueueWait
	}
	return s.cfg.QueueTimeout
}

// weightOf returns a tenant's fair-share weight, 1 unless configured.
func (s *Scheduler) weightOf(tenant string) float64 {
	if w := s.cfg.TenantWeights[tenant]; w > 0 {
		return w
	}
	return 1
}

// checkClasses reports what makes a list of classes unusable.
func checkClasses(cs []Class) error {
	seen := map[string]bool{}
	for i, c := range cs {
		switch {
		case c.Name == "":
			return fmt.Errorf("scheduler: class %d has no name", i)
		case seen[c.Name]:
			return fmt.Errorf("scheduler: class %q listed twice", c.Name)
		case c.MaxQueueWait < 0:
			return fmt.Errorf("scheduler: class %q: negative max_queue_wait %v", c.Name, c.MaxQueueWait)
		}
		seen[c.Name] = true
	}
	return nil
}

// sortClasses returns the classes in priority order, stable for equal
// priorities, and the index of the default (first configured) class.
func sortClasses(cs []Class) ([]Class, int) {
	if len(cs) == 0 {
		cs = DefaultClasses()
	}
	def := cs[0].Name
	out := slices.Clone(cs)
	slices.SortStableFunc(out, func(a, b Class) int { return cmp.Compare(a.Priority, b.Priority) })
	for i, c := range out {
		if c.Name == def {
			return out, i
		}
	}
	return out, 0
}
