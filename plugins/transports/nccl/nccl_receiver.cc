// The receiver side of the nccl transport: following sessions and filling the inbox.
#include <chrono>
#include <cstring>
#include <thread>

#include "common/transport_key.h"
#include "nccl_transport.h"
#include "nccl_wire.h"

namespace refit::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(20);

}  // namespace

bool NcclTransport::SessionReplaced(void* self) {
  auto* t = static_cast<NcclTransport*>(self);
  Result<std::optional<Session>> s = ReadSession(*t->session_);
  if (!s.ok() || !s.value()) return false;  // unreadable for a moment: keep waiting
  std::lock_guard<std::mutex> lock(t->mutex_);
  return s.value()->nonce != t->session_nonce_;
}

void NcclTransport::ReceiverLoop() {
  std::string done;  // the last session followed: never joined twice
  while (!stop_) {
    Result<std::optional<Session>> s = ReadSession(*session_);
    if (!s.ok() || !s.value() || s.value()->nonce == done) {
      std::this_thread::sleep_for(kPoll);
      continue;
    }
    Status st = FollowSession(*s.value());
    done = s.value()->nonce;
    if (!st.ok() && !stop_) {
      sdk::Log(REFIT_LOG_WARN, "nccl", "receiver '" + peer_ + "': " + st.message());
      std::lock_guard<std::mutex> lock(mutex_);
      last_error_ = st.message();
    }
  }
}

Status NcclTransport::FollowSession(const Session& session) {
  REFIT_RETURN_NOT_OK(Join(*session_, peer_, session.nonce));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    session_nonce_ = session.nonce;
  }
  const Clock::time_point start = Clock::now();
  std::optional<int> rank;
  while (!rank) {
    REFIT_ASSIGN_OR_RAISE(rank, ReadRank(*session_, session.nonce, peer_));
    if (rank) break;
    if (stop_ || SessionReplaced(this)) return Status::Timeout("nccl transport: session replaced");
    if (std::chrono::duration<double>(Clock::now() - start).count() > options_.connect_timeout_s) {
      return Status::Timeout("nccl transport: the sender assigned no rank within " +
                             std::to_string(static_cast<int64_t>(options_.connect_timeout_s)) +
                             " s (connect_timeout_s)");
    }
    std::this_thread::sleep_for(kPoll);
  }
  PipeOptions p;
  p.id = session.id;
  p.nranks = session.receivers + 1;
  p.rank = *rank;
  p.device = DeviceFor(*rank);
  p.bucket_bytes = session.bucket_bytes;
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<NcclPipe> pipe, NcclPipe::Open(rt_, p));
  Status st = ReceiveObjects(*pipe);
  if (!st.ok()) pipe->MarkBroken();
  return st;
}

Status NcclTransport::ReceiveObjects(NcclPipe& pipe) {
  // Between objects the sender may be idle for long: no deadline, but stop when destroyed or
  // when a new session replaced this one (the sender died without ending it).
  WaitPolicy idle;
  idle.stop = &stop_;
  idle.abandon = &NcclTransport::SessionReplaced;
  idle.ctx = this;
  WaitPolicy busy;
  busy.timeout_s = options_.op_timeout_s;
  busy.stop = &stop_;
  while (true) {
    Header h{};
    REFIT_RETURN_NOT_OK(pipe.Recv(reinterpret_cast<uint8_t*>(&h), sizeof(h), idle));
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.key_len > 512) {
      return Status::Corrupt("nccl transport: a broadcast header is malformed");
    }
    const std::string key(h.key, h.key_len);
    if (h.op == kOpEnd) return Status::OK();
    if (h.op == kOpRemove && h.len == 0 && IsPayloadKey(key)) {
      REFIT_RETURN_NOT_OK(Remove(key));
      REFIT_RETURN_NOT_OK(pipe.Confirm(kKept, busy).status());
      continue;
    }
    if (h.op != kOpPut || !IsPayloadKey(key) || !ValidateTransportKey(key).ok()) {
      return Status::Corrupt("nccl transport: a broadcast header names op " + std::to_string(h.op) +
                             " on a key that is not a payload key");
    }
    REFIT_ASSIGN_OR_RAISE(bool kept, ReceivePut(pipe, key, h.len, busy));
    REFIT_RETURN_NOT_OK(pipe.Confirm(kept ? kKept : kDropped, busy).status());
  }
}

// Under mutex_: makes room for len bytes of `key` by dropping payloads of older versions, the
// oldest first (std::map orders "v00000007/..." by version).
void NcclTransport::EvictFor(const std::string& key, uint64_t len) {
  const std::string version = key.substr(0, 9);
  while (inbox_used_ + len > options_.inbox_bytes && !inbox_.empty() &&
         inbox_.begin()->first.compare(0, 9, version) < 0) {
    inbox_used_ -= inbox_.begin()->second.size();
    inbox_.erase(inbox_.begin());
  }
}

// True when the payload is in the inbox, false when it was received and dropped for want of room.
Result<bool> NcclTransport::ReceivePut(NcclPipe& pipe, const std::string& key, uint64_t len,
                                       const WaitPolicy& busy) {
  bool fits = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped_.erase(key);
    EvictFor(key, len);
    fits = inbox_used_ + len <= options_.inbox_bytes;
    if (fits) inbox_used_ += len;  // reserved until it lands or fails
  }
  std::vector<uint8_t> bytes;
  if (fits) bytes.resize(len);
  // The broadcast is collective: a receiver without room still takes part, and drops the bytes.
  Status st = pipe.Recv(fits ? bytes.data() : nullptr, len, busy);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!st.ok() || !fits) {
    if (fits) inbox_used_ -= len;
    dropped_[key] = "nccl transport: payload '" + key + "' (" + std::to_string(len) +
                    " bytes) was not kept: " +
                    (st.ok() ? "inbox_bytes (" + std::to_string(options_.inbox_bytes) +
                                   ") is full with this version's payloads"
                             : st.message());
    if (!st.ok()) return st;
    return false;
  }
  auto old = inbox_.find(key);
  if (old != inbox_.end()) inbox_used_ -= old->second.size();
  inbox_[key] = std::move(bytes);
  return true;
}

}  // namespace refit::nccl
