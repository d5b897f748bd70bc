#include "format/model_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "common/file_util.h"

namespace refit::internal {

bool HoldsVersion(const SafetensorsFile& file, uint64_t version) {
  auto it = file.metadata().find(kVersionMetadataKey);
  return it != file.metadata().end() && it->second == std::to_string(version);
}

std::vector<TensorSpec> SpecsOf(const std::vector<TensorView>& tensors) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorView& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return specs;
}

Status CreateModelFile(const std::string& path, const std::vector<TensorSpec>& specs,
                       const SafetensorsFile* source, Metadata metadata) {
  std::vector<TensorView> layout;
  layout.reserve(specs.size());
  for (const TensorSpec& s : specs) {
    TensorView v;
    v.name = s.name;
    v.dtype = s.dtype;
    v.shape = s.shape;
    layout.push_back(std::move(v));
  }
  REFIT_ASSIGN_OR_RAISE(SafetensorsLayout plan, PlanSafetensors(layout, metadata));
  // Model files are written in state directories: O_NOFOLLOW so a link planted there never
  // carries the write elsewhere, O_NONBLOCK so a FIFO never blocks the open.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(Errno("create", path));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    return Status::Invalid(path + ": not a regular file");
  }
  // Truncated only once known to be a regular file of its own.
  if (::ftruncate(fd, 0) != 0) {
    Status st = Status::IoError(Errno("truncate", path));
    ::close(fd);
    return st;
  }
  Status st =
      WriteAll(fd, reinterpret_cast<const uint8_t*>(plan.header.data()), plan.header.size(), path);
  static const std::vector<uint8_t> zeros(1 << 20, 0);
  for (size_t i = 0; st.ok() && i < specs.size(); ++i) {
    const TensorView* src = source != nullptr ? source->Find(specs[i].name) : nullptr;
    uint64_t bytes = layout[i].nbytes();
    if (src != nullptr && src->dtype == specs[i].dtype && src->shape == specs[i].shape) {
      st = WriteAll(fd, src->bytes(), bytes, path);
    } else {
      for (uint64_t done = 0; st.ok() && done < bytes;) {
        uint64_t n = std::min<uint64_t>(zeros.size(), bytes - done);
        st = WriteAll(fd, zeros.data(), n, path);
        done += n;
      }
    }
  }
  if (st.ok()) st = FsyncFd(fd, path);
  ::close(fd);
  if (!st.ok()) ::unlink(path.c_str());
  return st;
}

}  // namespace refit::internal
