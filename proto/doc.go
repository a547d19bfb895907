// Package proto will hold rolter's .proto files and the generated Go code,
// checked in so that building never needs protoc or buf.
package proto
