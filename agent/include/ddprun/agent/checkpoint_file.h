// A persisted checkpoint file (docs/checkpoint.md, "Persisted format"): one
// rank's committed snapshot in safetensors' layout, readable without ddprun.
//
//   u64 little-endian N | N bytes of JSON header (space-padded to 8) | data
//
// The header names each array of the snapshot (torch tensors, numpy arrays,
// bytes) as a tensor {"dtype", "shape", "data_offsets": [begin, end]} by its
// key path ("model.fc.weight"); the data holds them back to back in the
// snapshot's order, without holes. Its "__metadata__" (string values, as
// safetensors wants) carries "ddprun.format" ("1"), "ddprun.step",
// "ddprun.rank", "ddprun.world_size" and "ddprun.tree": the snapshot's JSON
// tree with each array's "off" replaced by its tensor's name, from which
// the snapshot (checkpoint_layout.h, format 1) is rebuilt exactly.
// A dtype safetensors has no name for is stored as "U8" of shape [bytes];
// the tree keeps the real dtype and shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::agent {

inline constexpr const char* kCheckpointFileFormat = "1";

// Where the parts of a file come from: the header text, then the data as
// spans of the snapshot's bytes, in order (so a writer streams them).
struct CheckpointFilePlan {
  std::string head;  // the 8-byte length and the padded header
  struct Piece {
    std::uint64_t offset;  // in the snapshot bytes
    std::uint64_t size;
  };
  std::vector<Piece> pieces;
  std::uint64_t file_size = 0;
};

// The file of a snapshot (format 1 bytes, as a worker committed them) of
// `step` by RANK `rank` of `world_size`. An error (kInvalidArgument) says
// what in the snapshot does not parse.
absl::StatusOr<CheckpointFilePlan> PlanCheckpointFile(const std::string& snapshot,
                                                      std::int64_t step, int rank, int world_size);

// What a file holds, as the agent loads it back into a worker's memory.
struct LoadedCheckpoint {
  std::int64_t step = 0;
  int rank = 0;
  int world_size = 0;
  std::string snapshot;  // format 1 bytes
};

// Parses a whole file. An error (kInvalidArgument) says why it is not a
// ddprun checkpoint file ("not safetensors", "no ddprun metadata", ...).
absl::StatusOr<LoadedCheckpoint> ParseCheckpointFile(const std::string& file);

}  // namespace ddprun::agent
