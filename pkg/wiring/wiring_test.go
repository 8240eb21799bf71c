package wiring

import (
	"reflect"
	"testing"
)

// TestEveryTopicHasAKey: each field of Topics is named by exactly one of
// TopicKeys, so a topic added to the struct without a key (and so without
// its variable, default and HCL check) fails here.
func TestEveryTopicHasAKey(t *testing.T) {
	var topics Topics
	for _, k := range TopicKeys {
		if topics.Name(k) != "" {
			t.Errorf("topic key %s names a field another key already named", k)
		}
		topics.Set(k, k)
	}
	v := reflect.ValueOf(topics)
	for i := range v.NumField() {
		if v.Field(i).String() == "" {
			t.Errorf("Topics.%s has no key in TopicKeys", v.Type().Field(i).Name)
		}
	}
}
