// Local tensors <-> canonical boxes through a layout plugin: shared by the sender (which maps its
// shards to canonical records, and cuts records at the receivers' shard boundaries) and the
// receiver (which lands canonical records in its own shards).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "format/wire.h"
#include "receive/apply.h"
#include "refit/registry.h"

namespace refit::internal {

// One piece of a local tensor: what the layout says it covers.
struct LocalSlice {
  std::string local_name;
  SliceMap map;
};

// Every slice of every tensor (replicated slices included; callers filter by owner).
Result<std::vector<LocalSlice>> MapLocalTensors(const Layout& layout,
                                                const std::vector<TensorSpec>& tensors);

// Where a record (a box of a canonical tensor) lands among `slices` of the tensors `locals`:
// inside exactly one slice -> that local box. When the canonical tensor has slices here but none
// overlaps the record, the record belongs to another shard: skipped (ApplyTarget::tensor null)
// if skip_foreign, else an error. A record straddling a slice edge is an error naming the fix.
TensorResolver SliceResolver(std::vector<LocalSlice> slices,
                             std::map<std::string, TensorView*> locals, bool skip_foreign);

// Per canonical tensor, per dim, the sorted interior boundaries of a receiver layout's shards:
// records cut there land in exactly one receiver shard.
using ShardCuts = std::map<std::string, std::vector<std::vector<uint64_t>>>;

// The cuts of `layout_name` over `world` receiver ranks for the given canonical tensors.
Result<ShardCuts> ReceiverShardCuts(const Registry& registry, const Config* config,
                                    const std::string& layout_name, int world,
                                    const std::vector<TensorSpec>& canonical);

// `box` cut at every boundary of `cuts` that falls strictly inside it (row-major order).
std::vector<Box> CutBox(const Box& box, const std::vector<std::vector<uint64_t>>& cuts);

}  // namespace refit::internal
