// Package backend: the in-memory object store of the local cloud's Cloud
// Storage emulator.
//
// This file is not built as part of any raydrop package. The Makefile builds
// fake-gcs-server with it in place of the emulator's own
// internal/backend/memory.go (go build -overlay, see overlay.sh), keeping
// every other file of the pinned release: the HTTP APIs, preconditions,
// notifications and the filesystem store are fake-gcs-server's.
//
// Why: the released in-memory store keeps a bucket's objects in one slice
// and finds an object by formatting and comparing the bucket/name string of
// every object it holds, on every request. With the few thousand objects of
// a benchmark burst, each request took 10 ms and more, so the local cloud
// measured its own emulator rather than the pipeline; Cloud Storage's
// latency does not grow with the number of objects in a bucket. This store
// indexes objects by name (a map, and a sorted name list for prefix
// listings), and keeps the released store's behaviour otherwise:
//   - a write that names an existing generation replaces that generation's
//     metadata in place (metadata patches, ACL changes);
//   - a new write to a versioned bucket archives the live generation;
//   - deleting a named generation removes it outright;
//   - a write to a bucket that does not exist creates it.
//
// Two things it does better, as Cloud Storage does: generations it assigns
// strictly increase (the released store used the clock's microseconds,
// which two writes in one microsecond share), and a read-modify-write of
// metadata (patch, update, compose) happens under one lock, and hands out
// copies, so a concurrent request never sees a half-applied change.
//
// fake-gcs-server's own backend and fakestorage tests run against this
// store (make fakegcs-test).
package backend

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/storage"

	"github.com/fsouza/fake-gcs-server/internal/checksum"
)

const timestampFormat = "2006-01-02T15:04:05.999999Z07:00"

var errObjectNotFound = errors.New("object not found")

// storageMemory is the in-memory Storage.
type storageMemory struct {
	mtx     sync.RWMutex
	buckets map[string]*bucketInMemory
	// lastGeneration is the last generation the store assigned.
	lastGeneration int64
}

// bucketInMemory holds one bucket's objects.
type bucketInMemory struct {
	Bucket
	live  map[string]Object // the live generation of each object, by name
	names []string          // the keys of live, sorted
	// archived holds the noncurrent generations of each object, oldest
	// first, and archivedNames its keys, sorted.
	archived      map[string][]Object
	archivedNames []string
}

// NewStorageMemory creates an in-memory Storage holding objects.
func NewStorageMemory(objects []StreamingObject) (Storage, error) {
	s := &storageMemory{buckets: map[string]*bucketInMemory{}}
	for _, o := range objects {
		obj, err := o.BufferedObject()
		if err != nil {
			return nil, err
		}
		s.bucket(o.BucketName, BucketAttrs{}).add(obj, s.nextGeneration)
	}
	return s, nil
}

// nextGeneration returns a generation greater than every one assigned
// before: the clock's microseconds, as Cloud Storage's generations are,
// bumped where two writes share one.
func (s *storageMemory) nextGeneration() int64 {
	s.lastGeneration = max(time.Now().UnixNano()/1000, s.lastGeneration+1)
	return s.lastGeneration
}

// bucket returns the named bucket, creating it with attrs if there is none.
func (s *storageMemory) bucket(name string, attrs BucketAttrs) *bucketInMemory {
	if b, ok := s.buckets[name]; ok {
		return b
	}
	b := &bucketInMemory{
		Bucket:   Bucket{Name: name, VersioningEnabled: attrs.VersioningEnabled, TimeCreated: time.Now(), DefaultEventBasedHold: attrs.DefaultEventBasedHold, ACL: attrs.ACL},
		live:     map[string]Object{},
		archived: map[string][]Object{},
	}
	s.buckets[name] = b
	return b
}

func (s *storageMemory) existing(name string) (*bucketInMemory, error) {
	if b, ok := s.buckets[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("no bucket named %s", name)
}

// insertName adds name to the sorted list names, if it is not there.
func insertName(names []string, name string) []string {
	i, found := slices.BinarySearch(names, name)
	if found {
		return names
	}
	return slices.Insert(names, i, name)
}

// removeName takes name off the sorted list names.
func removeName(names []string, name string) []string {
	if i, found := slices.BinarySearch(names, name); found {
		return slices.Delete(names, i, i+1)
	}
	return names
}

// withPrefix returns the names of the sorted list names that start with
// prefix.
func withPrefix(names []string, prefix string) []string {
	start := sort.SearchStrings(names, prefix)
	end := start
	for end < len(names) && strings.HasPrefix(names[end], prefix) {
		end++
	}
	return names[start:end]
}

// copyOf returns obj with its own metadata map and ACL, so that changing
// one never changes the other.
func copyOf(obj Object) Object {
	obj.Metadata = maps.Clone(obj.Metadata)
	obj.ACL = slices.Clone(obj.ACL)
	return obj
}

// add stores obj and returns it as stored. An object that names an existing
// generation replaces that generation; any other becomes the live
// generation, with a new generation number from next, archiving the one it
// replaces in a versioned bucket.
func (b *bucketInMemory) add(obj Object, next func() int64) Object {
	if obj.Crc32c == "" {
		obj.Crc32c = checksum.EncodedCrc32cChecksum(obj.Content)
	}
	if obj.Md5Hash == "" {
		obj.Md5Hash = checksum.EncodedMd5Hash(obj.Content)
	}
	if obj.Etag == "" {
		obj.Etag = obj.Md5Hash
	}
	if obj.Size == 0 {
		obj.Size = int64(len(obj.Content))
	}
	if obj.StorageClass == "" {
		obj.StorageClass = "STANDARD"
	}
	obj.BucketName = b.Name
	obj = copyOf(obj)
	if obj.Generation != 0 {
		if cur, ok := b.live[obj.Name]; ok && cur.Generation == obj.Generation {
			b.live[obj.Name] = obj
			return copyOf(obj)
		}
		versions := b.archived[obj.Name]
		if i := slices.IndexFunc(versions, func(o Object) bool { return o.Generation == obj.Generation }); i >= 0 {
			versions[i] = obj
			return copyOf(obj)
		}
	} else {
		obj.Generation = next()
	}
	if cur, ok := b.live[obj.Name]; ok && b.VersioningEnabled {
		cur.Deleted = time.Now().Format(timestampFormat)
		b.archive(cur)
	}
	b.live[obj.Name] = obj
	b.names = insertName(b.names, obj.Name)
	return copyOf(obj)
}

func (b *bucketInMemory) archive(obj Object) {
	b.archived[obj.Name] = append(b.archived[obj.Name], obj)
	b.archivedNames = insertName(b.archivedNames, obj.Name)
}

// removeLive takes the live generation of name off the bucket.
func (b *bucketInMemory) removeLive(name string) {
	delete(b.live, name)
	b.names = removeName(b.names, name)
}

// get returns the live generation of name (generation 0), or the named
// generation, live or archived.
func (b *bucketInMemory) get(name string, generation int64) (Object, bool) {
	if cur, ok := b.live[name]; ok && (generation == 0 || cur.Generation == generation) {
		return copyOf(cur), true
	}
	if generation == 0 {
		return Object{}, false
	}
	for _, o := range b.archived[name] {
		if o.Generation == generation {
			return copyOf(o), true
		}
	}
	return Object{}, false
}

// CreateBucket implements Storage.
func (s *storageMemory) CreateBucket(name string, attrs BucketAttrs) error {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	if b, ok := s.buckets[name]; ok {
		if b.VersioningEnabled != attrs.VersioningEnabled {
			return fmt.Errorf("a bucket named %s already exists, but with different properties", name)
		}
		return nil
	}
	s.bucket(name, attrs)
	return nil
}

// ListBuckets implements Storage.
func (s *storageMemory) ListBuckets() ([]Bucket, error) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	out := []Bucket{}
	for _, b := range s.buckets {
		out = append(out, b.Bucket)
	}
	return out, nil
}

// GetBucket implements Storage.
func (s *storageMemory) GetBucket(name string) (Bucket, error) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	b, err := s.existing(name)
	if err != nil {
		return Bucket{}, err
	}
	return b.Bucket, nil
}

// UpdateBucket implements Storage.
func (s *storageMemory) UpdateBucket(name string, attrs BucketAttrs) error {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	b, err := s.existing(name)
	if err != nil {
		return BucketNotFound
	}
	b.DefaultEventBasedHold = attrs.DefaultEventBasedHold
	b.VersioningEnabled = attrs.VersioningEnabled
	return nil
}

// UpdateBucketACL implements Storage.
func (s *storageMemory) UpdateBucketACL(name string, acl []storage.ACLRule) error {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	b, err := s.existing(name)
	if err != nil {
		return BucketNotFound
	}
	b.ACL = acl
	return nil
}

// DeleteBucket implements Storage: only a bucket without live objects can
// be deleted.
func (s *storageMemory) DeleteBucket(name string) error {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	b, err := s.existing(name)
	if err != nil {
		return BucketNotFound
	}
	if len(b.live) > 0 {
		return BucketNotEmpty
	}
	delete(s.buckets, name)
	return nil
}

// CreateObject implements Storage: it stores obj if conditions hold for the
// live generation (0 when there is none).
func (s *storageMemory) CreateObject(obj StreamingObject, conditions Conditions) (StreamingObject, error) {
	buffered, err := obj.BufferedObject()
	s.mtx.Lock()
	defer s.mtx.Unlock()
	b := s.bucket(obj.BucketName, BucketAttrs{})
	if !conditions.ConditionsMet(b.live[obj.Name].Generation) {
		return StreamingObject{}, PreConditionFailed
	}
	if err != nil {
		return StreamingObject{}, err
	}
	return b.add(buffered, s.nextGeneration).StreamingObject(), nil
}

// ListObjects implements Storage: the live objects whose names start with
// prefix, then, with versions, their noncurrent generations.
func (s *storageMemory) ListObjects(bucketName, prefix string, versions bool) ([]ObjectAttrs, error) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	b, err := s.existing(bucketName)
	if err != nil {
		return []ObjectAttrs{}, err
	}
	names := withPrefix(b.names, prefix)
	out := make([]ObjectAttrs, 0, len(names))
	for _, n := range names {
		out = append(out, copyOf(b.live[n]).ObjectAttrs)
	}
	if versions {
		for _, n := range withPrefix(b.archivedNames, prefix) {
			for _, o := range b.archived[n] {
				out = append(out, copyOf(o).ObjectAttrs)
			}
		}
	}
	return out, nil
}

// GetObject implements Storage.
func (s *storageMemory) GetObject(bucketName, objectName string) (StreamingObject, error) {
	return s.GetObjectWithGeneration(bucketName, objectName, 0)
}

// GetObjectWithGeneration implements Storage: generation 0 is the live one.
func (s *storageMemory) GetObjectWithGeneration(bucketName, objectName string, generation int64) (StreamingObject, error) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	return s.get(bucketName, objectName, generation)
}

func (s *storageMemory) get(bucketName, objectName string, generation int64) (StreamingObject, error) {
	b, err := s.existing(bucketName)
	if err != nil {
		return StreamingObject{}, err
	}
	obj, ok := b.get(objectName, generation)
	if !ok {
		missing := Object{ObjectAttrs: ObjectAttrs{BucketName: bucketName, Name: objectName, Generation: generation}}
		return missing.StreamingObject(), errObjectNotFound
	}
	return obj.StreamingObject(), nil
}

// DeleteObject implements Storage: it deletes the live generation,
// archiving it in a versioned bucket.
func (s *storageMemory) DeleteObject(bucketName, objectName string) error {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	b, err := s.existing(bucketName)
	if err != nil {
		return err
	}
	cur, ok := b.live[objectName]
	if !ok {
		return errObjectNotFound
	}
	b.removeLive(objectName)
	if b.VersioningEnabled {
		cur.Deleted = time.Now().Format(timestampFormat)
		b.archive(cur)
	}
	return nil
}

// DeleteObjectWithGeneration implements Storage: deleting a named
// generation, live or archived, removes its data outright, as Cloud Storage
// does; generation 0 is a DeleteObject.
func (s *storageMemory) DeleteObjectWithGeneration(bucketName, objectName string, generation int64) error {
	if generation == 0 {
		return s.DeleteObject(bucketName, objectName)
	}
	s.mtx.Lock()
	defer s.mtx.Unlock()
	b, err := s.existing(bucketName)
	if err != nil {
		return err
	}
	if cur, ok := b.live[objectName]; ok && cur.Generation == generation {
		b.removeLive(objectName)
		return nil
	}
	versions := b.archived[objectName]
	i := slices.IndexFunc(versions, func(o Object) bool { return o.Generation == generation })
	if i < 0 {
		return errObjectNotFound
	}
	versions = slices.Delete(versions, i, i+1)
	if len(versions) == 0 {
		delete(b.archived, objectName)
		b.archivedNames = removeName(b.archivedNames, objectName)
	} else {
		b.archived[objectName] = versions
	}
	return nil
}

// changeLive applies change to the live generation of an object, in place,
// and returns the object as changed.
func (s *storageMemory) changeLive(bucketName, objectName string, change func(*StreamingObject)) (StreamingObject, error) {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	obj, err := s.get(bucketName, objectName, 0)
	if err != nil {
		return StreamingObject{}, err
	}
	change(&obj)
	buffered, err := obj.BufferedObject()
	if err != nil {
		return StreamingObject{}, err
	}
	return s.buckets[bucketName].add(buffered, s.nextGeneration).StreamingObject(), nil
}

// PatchObject implements Storage: the fields set in attrsToUpdate replace
// the object's, and its metadata gains attrsToUpdate's keys.
func (s *storageMemory) PatchObject(bucketName, objectName string, attrsToUpdate ObjectAttrs) (StreamingObject, error) {
	return s.changeLive(bucketName, objectName, func(obj *StreamingObject) {
		obj.patch(attrsToUpdate)
	})
}

// UpdateObject implements Storage: as PatchObject, except that metadata in
// attrsToUpdate replaces the object's whole metadata.
func (s *storageMemory) UpdateObject(bucketName, objectName string, attrsToUpdate ObjectAttrs) (StreamingObject, error) {
	return s.changeLive(bucketName, objectName, func(obj *StreamingObject) {
		if attrsToUpdate.Metadata != nil {
			obj.Metadata = map[string]string{}
		}
		obj.patch(attrsToUpdate)
	})
}

// ComposeObject implements Storage: the destination gets the sources'
// contents concatenated, in a new generation.
func (s *storageMemory) ComposeObject(bucketName string, objectNames []string, destinationName string, metadata map[string]string, contentType string, contentEncoding string, contentDisposition string, contentLanguage string, cacheControl string, storageClass string, acl []storage.ACLRule) (StreamingObject, error) {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	var data []byte
	for _, n := range objectNames {
		src, err := s.get(bucketName, n, 0)
		if err != nil {
			return StreamingObject{}, err
		}
		content, err := io.ReadAll(src.Content)
		if err != nil {
			return StreamingObject{}, err
		}
		data = append(data, content...)
	}
	b, err := s.existing(bucketName)
	if err != nil {
		return StreamingObject{}, err
	}
	dest, ok := b.get(destinationName, 0)
	if !ok {
		now := time.Now().Format(timestampFormat)
		dest = Object{ObjectAttrs: ObjectAttrs{
			BucketName:         bucketName,
			Name:               destinationName,
			ContentType:        contentType,
			ContentEncoding:    contentEncoding,
			ContentDisposition: contentDisposition,
			ContentLanguage:    contentLanguage,
			CacheControl:       cacheControl,
			StorageClass:       storageClass,
			Created:            now,
			Updated:            now,
		}}
	}
	if acl != nil {
		dest.ACL = acl
	}
	dest.Content = data
	dest.Crc32c, dest.Md5Hash, dest.Etag, dest.Size = "", "", "", 0
	dest.Metadata = metadata
	dest.Generation = 0
	return b.add(dest, s.nextGeneration).StreamingObject(), nil
}

// DeleteAllFiles implements Storage: it empties the store, buckets and all.
func (s *storageMemory) DeleteAllFiles() error {
	s.mtx.Lock()
	defer s.mtx.Unlock()
	s.buckets = map[string]*bucketInMemory{}
	return nil
}
