// Package localcloud runs raydrop's whole pipeline on one machine.
package localcloud
