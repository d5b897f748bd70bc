#include "nccl_transport.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/transport_key.h"
#include "nccl_session.h"
#include "nccl_wire.h"

namespace refit::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr double kEndTimeoutS = 10;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

Result<NcclOptions> ReadOptions(const sdk::ConfigView& cfg) {
  NcclOptions o;
  REFIT_ASSIGN_OR_RAISE(o.control_dir, cfg.GetString("control_dir", ""));
  REFIT_ASSIGN_OR_RAISE(o.fsync, cfg.GetBool("fsync", true));
  REFIT_ASSIGN_OR_RAISE(int64_t receivers, cfg.GetInt("receivers", 1));
  REFIT_ASSIGN_OR_RAISE(o.bucket_bytes, cfg.GetSize("bucket_bytes", o.bucket_bytes));
  REFIT_ASSIGN_OR_RAISE(int64_t device, cfg.GetInt("device", -1));
  REFIT_ASSIGN_OR_RAISE(o.inbox_bytes, cfg.GetSize("inbox_bytes", o.inbox_bytes));
  REFIT_ASSIGN_OR_RAISE(o.connect_timeout_s, cfg.GetDouble("connect_timeout_s", 120));
  REFIT_ASSIGN_OR_RAISE(o.op_timeout_s, cfg.GetDouble("op_timeout_s", 300));
  if (o.control_dir.empty()) {
    return Status::Invalid("nccl transport: [transport.nccl] control_dir is required");
  }
  if (receivers < 0 || receivers > 4096) {
    return Status::Invalid("nccl transport: receivers must be 0..4096, not " +
                           std::to_string(receivers));
  }
  if (o.bucket_bytes < (uint64_t{64} << 10) || o.bucket_bytes > (uint64_t{4} << 30)) {
    return Status::Invalid("nccl transport: bucket_bytes must be 64KiB..4GiB");
  }
  if (device < -1 || device > 1023) {
    return Status::Invalid("nccl transport: device must be -1 (rank % devices) or a device index");
  }
  if (o.connect_timeout_s <= 0 || o.op_timeout_s <= 0) {
    return Status::Invalid("nccl transport: connect_timeout_s and op_timeout_s must be > 0");
  }
  o.receivers = static_cast<int>(receivers);
  o.device = static_cast<int>(device);
  return o;
}

}  // namespace

bool NcclTransport::IsPayloadKey(const std::string& key) {
  static const std::string kPayload = "/payload.";
  if (key.size() <= 9 + kPayload.size() || key[0] != 'v') return false;
  for (size_t i = 1; i < 9; ++i) {
    if (key[i] < '0' || key[i] > '9') return false;
  }
  return key.compare(9, kPayload.size(), kPayload) == 0;
}

Result<std::unique_ptr<NcclTransport>> NcclTransport::Create(const sdk::ConfigView& cfg,
                                                             refit_transport_role_t role,
                                                             const std::string& peer_id) {
  REFIT_ASSIGN_OR_RAISE(NcclOptions options, ReadOptions(cfg));
  // Before touching the control directory: a machine without a GPU gets one line and no files.
  REFIT_ASSIGN_OR_RAISE(const Runtime* rt, RequireDevice());
  if (role == REFIT_ROLE_RECEIVER &&
      (peer_id.find('/') != std::string::npos || !ValidateTransportKey("join/" + peer_id).ok())) {
    return Status::Invalid("nccl transport: receiver id '" + peer_id +
                           "' must be one key component ([A-Za-z0-9._-]+)");
  }
  std::unique_ptr<NcclTransport> t(new NcclTransport(std::move(options), role, peer_id, *rt));
  REFIT_RETURN_NOT_OK(t->OpenControl());
  if (role == REFIT_ROLE_SENDER) {
    REFIT_RETURN_NOT_OK(t->StartSender());
  } else {
    t->thread_ = std::thread(&NcclTransport::ReceiverLoop, t.get());
  }
  return t;
}

Status NcclTransport::OpenControl() {
  REFIT_ASSIGN_OR_RAISE(
      objects_, disk::DiskTransport::Open({options_.control_dir + "/objects", options_.fsync}));
  REFIT_ASSIGN_OR_RAISE(
      session_, disk::DiskTransport::Open({options_.control_dir + "/nccl", options_.fsync}));
  return Status::OK();
}

int NcclTransport::DeviceFor(int rank) const {
  if (options_.device >= 0) return options_.device;
  int count = 1;
  if (rt_.cuda.GetDeviceCount(&count) != cudaSuccess || count < 1) count = 1;
  return rank % count;
}

Status NcclTransport::StartSender() {
  Session s;
  s.nonce = NewNonce();
  s.receivers = options_.receivers;
  s.bucket_bytes = options_.bucket_bytes;
  REFIT_RETURN_NOT_OK(NcclCheck(rt_.nccl.GetUniqueId(&s.id), "ncclGetUniqueId"));
  REFIT_RETURN_NOT_OK(PublishSession(*session_, s));
  const Clock::time_point start = Clock::now();
  std::vector<std::string> peers;
  while (true) {
    REFIT_ASSIGN_OR_RAISE(peers, JoinedPeers(*session_, s.nonce));
    if (peers.size() >= static_cast<size_t>(s.receivers)) break;
    if (Seconds(start) > options_.connect_timeout_s) {
      return Status::Timeout("nccl transport: " + std::to_string(peers.size()) + " of " +
                             std::to_string(s.receivers) + " receivers joined within " +
                             std::to_string(static_cast<int64_t>(options_.connect_timeout_s)) +
                             " s (connect_timeout_s; control_dir " + options_.control_dir + ")");
    }
    std::this_thread::sleep_for(kPoll);
  }
  if (peers.size() > static_cast<size_t>(s.receivers)) {
    sdk::Log(REFIT_LOG_WARN, "nccl",
             std::to_string(peers.size()) + " receivers joined, " + std::to_string(s.receivers) +
                 " expected: the first by id take part");
    peers.resize(static_cast<size_t>(s.receivers));
  }
  REFIT_RETURN_NOT_OK(PublishRanks(*session_, s.nonce, peers));
  PipeOptions p;
  p.id = s.id;
  p.nranks = s.receivers + 1;
  p.rank = 0;
  p.device = DeviceFor(0);
  p.bucket_bytes = s.bucket_bytes;
  REFIT_ASSIGN_OR_RAISE(pipe_, NcclPipe::Open(rt_, p));
  return Status::OK();
}

NcclTransport::~NcclTransport() {
  if (role_ == REFIT_ROLE_SENDER) {
    std::lock_guard<std::mutex> lock(send_mutex_);
    if (pipe_ != nullptr && !pipe_->broken()) {
      // Receivers leave the session cleanly instead of waiting for it to be replaced.
      Header h{};
      std::memcpy(h.magic, kMagic, sizeof(kMagic));
      h.op = kOpEnd;
      // Best effort and short: receivers that are already gone must not hold up the sender.
      WaitPolicy wait;
      wait.timeout_s = std::min(options_.op_timeout_s, kEndTimeoutS);
      (void)pipe_->Send(reinterpret_cast<const uint8_t*>(&h), sizeof(h), wait);
    }
    pipe_.reset();
    // A receiver started later must not join a session nobody serves any more.
    if (session_ != nullptr) {
      (void)session_->Remove("ranks");
      (void)session_->Remove("session");
    }
    return;
  }
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status NcclTransport::Broadcast(uint32_t op, const std::string& key, const uint8_t* data,
                                uint64_t len) {
  std::lock_guard<std::mutex> lock(send_mutex_);
  if (pipe_ == nullptr || pipe_->broken()) {
    return Status::IoError(
        "nccl transport: the session is broken (an earlier broadcast failed); "
        "a new transport instance starts a new one");
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.op = op;
  h.key_len = static_cast<uint32_t>(key.size());
  h.len = len;
  std::memcpy(h.key, key.data(), key.size());
  WaitPolicy wait;
  wait.timeout_s = options_.op_timeout_s;
  REFIT_RETURN_NOT_OK(pipe_->Send(reinterpret_cast<const uint8_t*>(&h), sizeof(h), wait));
  REFIT_RETURN_NOT_OK(pipe_->Send(data, len, wait));
  // Returns once every receiver holds it (or dropped it): readers never find it missing.
  REFIT_ASSIGN_OR_RAISE(int32_t answer, pipe_->Confirm(kKept, wait));
  if (answer == kKept) return Status::OK();
  return Status::IoError("nccl transport: a receiver had no room for '" + key +
                         "' (its inbox_bytes is full with this version's payloads)");
}

Status NcclTransport::Put(const std::string& key, const uint8_t* data, uint64_t len) {
  if (!IsPayloadKey(key)) return objects_->Put(key, data, len);
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (role_ != REFIT_ROLE_SENDER) {
    return Status::Invalid("nccl transport: only the sender puts payloads ('" + key + "')");
  }
  REFIT_RETURN_NOT_OK(Broadcast(kOpPut, key, data, len));
  std::lock_guard<std::mutex> lock(mutex_);
  sent_[key] = len;
  return Status::OK();
}

Result<std::optional<uint64_t>> NcclTransport::Size(const std::string& key) {
  if (!IsPayloadKey(key)) return objects_->Size(key);
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  std::lock_guard<std::mutex> lock(mutex_);
  if (role_ == REFIT_ROLE_SENDER) {
    auto it = sent_.find(key);
    return it == sent_.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  auto dropped = dropped_.find(key);
  if (dropped != dropped_.end()) return Status::IoError(dropped->second);
  auto it = inbox_.find(key);
  return it == inbox_.end() ? std::nullopt : std::optional<uint64_t>(it->second.size());
}

Status NcclTransport::Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
  if (!IsPayloadKey(key)) return objects_->Get(key, offset, buf, len);
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  std::lock_guard<std::mutex> lock(mutex_);
  if (role_ == REFIT_ROLE_SENDER) {
    if (sent_.count(key) == 0) return Status::NotFound("nccl transport: no payload '" + key + "'");
    return Status::Unsupported("nccl transport: payload '" + key +
                               "' was broadcast, not stored: the sender cannot read it back "
                               "(set sender.verify_puts = false)");
  }
  auto dropped = dropped_.find(key);
  if (dropped != dropped_.end()) return Status::IoError(dropped->second);
  auto it = inbox_.find(key);
  if (it == inbox_.end()) {
    return Status::NotFound("nccl transport: no payload '" + key + "' received" +
                            (last_error_.empty() ? "" : " (last session: " + last_error_ + ")"));
  }
  const std::vector<uint8_t>& bytes = it->second;
  if (offset > bytes.size() || len > bytes.size() - offset) {
    return Status::Corrupt("nccl transport: get '" + key + "' [" + std::to_string(offset) + ", +" +
                           std::to_string(len) + ") is past its end (" +
                           std::to_string(bytes.size()) + " bytes)");
  }
  if (len > 0) std::memcpy(buf, bytes.data() + offset, len);
  return Status::OK();
}

Result<std::vector<std::pair<std::string, uint64_t>>> NcclTransport::List(
    const std::string& prefix) {
  REFIT_RETURN_NOT_OK(ValidateTransportPrefix(prefix));
  REFIT_ASSIGN_OR_RAISE(auto listed, objects_->List(prefix));
  std::lock_guard<std::mutex> lock(mutex_);
  if (role_ == REFIT_ROLE_SENDER) {
    for (auto it = sent_.lower_bound(prefix); it != sent_.end() && StartsWith(it->first, prefix);
         ++it) {
      listed.emplace_back(it->first, it->second);
    }
  } else {
    for (auto it = inbox_.lower_bound(prefix); it != inbox_.end() && StartsWith(it->first, prefix);
         ++it) {
      listed.emplace_back(it->first, it->second.size());
    }
  }
  std::sort(listed.begin(), listed.end());
  return listed;
}

Status NcclTransport::Remove(const std::string& key) {
  if (!IsPayloadKey(key)) return objects_->Remove(key);
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (role_ == REFIT_ROLE_SENDER) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (sent_.erase(key) == 0) return Status::OK();
    }
    // Receivers drop it too: the sender's retention bounds their inboxes.
    return Broadcast(kOpRemove, key, nullptr, 0);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = inbox_.find(key);
  if (it != inbox_.end()) {
    inbox_used_ -= it->second.size();
    inbox_.erase(it);
  }
  dropped_.erase(key);
  return Status::OK();
}

}  // namespace refit::nccl
