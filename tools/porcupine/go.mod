module shardcheck-porcupine

go 1.19

require github.com/anishathalye/porcupine v1.3.0

// Porcupine's source, v1.3.0, checked out here (see README.md); no network is needed to build.
replace github.com/anishathalye/porcupine => ./porcupine
