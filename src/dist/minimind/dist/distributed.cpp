// Compiled without the shared precompiled header: ProcessGroupGloo.hpp is only visible
// with USE_C10D_GLOO, which must not be defined for the other translation units.
#define USE_C10D_GLOO 1
#include "minimind/dist/distributed.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>

#include "minimind/util/stopwatch.h"

namespace minimind {

namespace {

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = env_or_null(name);
  if (!v)
    throw DistError(
        fmt::format("{} is not set; a multi-process run needs RANK, WORLD_SIZE, "
                    "MASTER_ADDR and MASTER_PORT (as torchrun sets them)",
                    name));
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw DistError(fmt::format("{}='{}' is not an integer in [{}, {}]", name, v, lo, hi));
  return static_cast<int>(x);
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The network device Gloo uses on this rank: GLOO_SOCKET_IFNAME if set (as in PyTorch),
// loopback for a job on 127.0.0.1, else the address this machine's hostname resolves to.
std::shared_ptr<gloo::transport::Device> gloo_device(const DistEnv& env) {
  if (const char* ifname = env_or_null("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(env.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Gloo's options for a process group of this job: this rank's device, two threads.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options(
    const DistEnv& env, std::chrono::milliseconds timeout) {
  auto o = c10d::ProcessGroupGloo::Options::create(timeout);
  o->devices.push_back(gloo_device(env));
  o->threads = 2;
  return o;
}

}  // namespace

struct Distributed::Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
};

DistEnv dist_env_from_environment() {
  DistEnv env;
  if (!env_or_null("WORLD_SIZE") && !env_or_null("RANK")) return env;
  env.world_size = env_int("WORLD_SIZE", 1, 1 << 20);
  env.rank = env_int("RANK", 0, env.world_size - 1);
  // torchrun always sets the LOCAL_ pair; other launchers may not: then assume every rank
  // shares this machine (the safe choice for the threads-per-rank default).
  env.local_world_size = env_or_null("LOCAL_WORLD_SIZE")
                             ? env_int("LOCAL_WORLD_SIZE", 1, env.world_size)
                             : env.world_size;
  env.local_rank = env_or_null("LOCAL_RANK") ? env_int("LOCAL_RANK", 0, env.local_world_size - 1)
                                             : env.rank % env.local_world_size;
  if (env.world_size > 1) {
    if (!env_or_null("MASTER_ADDR")) env_int("MASTER_ADDR", 0, 0);  // throws "not set"
    env.master_addr = std::getenv("MASTER_ADDR");
    env.master_port = env_int("MASTER_PORT", 1, 65535);
  }
  return env;
}

Distributed::Distributed(const DistEnv& env, std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout) {
  if (env.world_size <= 1) return;
  group_ = std::make_unique<Group>();
  try {
    // Rendezvous: rank 0 serves the store and waits until every rank has connected.
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.numWorkers = static_cast<size_t>(env.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    group_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
#ifdef USE_C10D_NCCL
    // A CUDA LibTorch: GPUs talk over NCCL (untested here: this machine has no GPU).
    if (torch::cuda::is_available()) {
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;
      group_->pg =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(group_->store, env.rank, env.world_size, o);
      return;
    }
#endif
    group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        group_->store, env.rank, env.world_size, gloo_options(env, timeout));
  } catch (const std::exception& e) {
    throw DistError(fmt::format(
        "rank {} of {} could not join the job at {}:{} within {} s (is every rank started, and "
        "the port free?): {}",
        env.rank, env.world_size, env.master_addr, env.master_port, timeout.count() / 1000.0,
        e.what()));
  }
}

Distributed::Distributed() = default;
Distributed::~Distributed() = default;

std::string Distributed::who() const {
  if (job_ranks_.empty()) return fmt::format("rank {} of {}", env_.rank, env_.world_size);
  return fmt::format("rank {} of {}", job_ranks_[static_cast<size_t>(env_.rank)], job_world_);
}

void Distributed::run(const char* what, const std::function<void()>& op) {
  if (!group_) return;
  const Stopwatch watch;
  try {
    op();
  } catch (const std::exception& e) {
    const std::string why = e.what();
    // In a group of two (an expert group of two ranks) the lost rank is the other one.
    std::string other = "another rank";
    if (job_ranks_.size() == 2)
      other = fmt::format("rank {}", job_ranks_[static_cast<size_t>(1 - env_.rank)]);
    // The usual case: another rank ended (its own error says why, e.g. a refused run
    // directory), closing its connections. Say that plainly rather than as a network fault.
    if (why.find("Connection closed by peer") != std::string::npos ||
        why.find("Connection reset by peer") != std::string::npos)
      throw DistError(
          fmt::format("{}: {} has ended (stopped, failed or was killed: its own message, if "
                      "any, says why) during {}; stopping too (the last checkpoint is intact)",
                      who(), other, what));
    throw DistError(fmt::format(
        "{}: {} failed — {} stopped, crashed or did not answer within {} s; the job stops "
        "here (the last checkpoint is intact): {}",
        who(), what, other, timeout_.count() / 1000.0, why));
  }
  comm_seconds_ += watch.seconds();
}

void Distributed::all_reduce_sum(torch::Tensor& t) {
  run("all-reduce", [&] {
    std::vector<torch::Tensor> v{t};
    group_->pg->allreduce(v)->wait();
  });
}

void Distributed::all_reduce_sum(std::vector<int64_t>& values) {
  if (!group_ || values.empty()) return;
  torch::Tensor t = torch::from_blob(values.data(), {static_cast<int64_t>(values.size())},
                                     torch::kLong);  // a view of `values`, reduced in place
  all_reduce_sum(t);
}

void Distributed::all_reduce_sum(std::vector<double>& values) {
  if (!group_ || values.empty()) return;
  torch::Tensor t =
      torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kFloat64);
  all_reduce_sum(t);
}

void Distributed::all_reduce_max(torch::Tensor& t) {
  run("all-reduce", [&] {
    std::vector<torch::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    group_->pg->allreduce(v, o)->wait();
  });
}

void Distributed::average_gradients(const std::vector<torch::Tensor>& params,
                                    int64_t bucket_bytes) {
  sum_gradients_divided(params, env_.world_size, bucket_bytes);
}

void Distributed::sum_gradients_divided(const std::vector<torch::Tensor>& params, double divisor,
                                        int64_t bucket_bytes) {
  if (!group_) {
    if (divisor != 1) {
      torch::NoGradGuard no_grad;
      for (const auto& p : params) p.mutable_grad().div_(divisor);
    }
    return;
  }
  torch::NoGradGuard no_grad;
  // Consecutive parameters of one dtype share a bucket until it holds bucket_bytes.
  size_t first = 0;
  while (first < params.size()) {
    size_t last = first;
    int64_t bytes = 0;
    while (last < params.size() && params[last].scalar_type() == params[first].scalar_type() &&
           (last == first || bytes + params[last].nbytes() <= static_cast<size_t>(bucket_bytes)))
      bytes += params[last++].nbytes();
    std::vector<torch::Tensor> grads;
    for (size_t i = first; i < last; ++i) {
      if (!params[i].grad().defined())
        throw DistError(
            "average_gradients: a parameter has no gradient (fill_missing_gradients first)");
      grads.push_back(params[i].grad().reshape({-1}));
    }
    torch::Tensor flat = torch::cat(grads);  // [sum of numel]
    all_reduce_sum(flat);
    flat.div_(divisor);
    int64_t offset = 0;
    for (size_t i = first; i < last; ++i) {
      torch::Tensor g = params[i].mutable_grad();
      g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
    first = last;
  }
}

void Distributed::broadcast_from_main(const std::vector<torch::Tensor>& tensors) {
  run("broadcast", [&] {
    torch::NoGradGuard no_grad;
    for (const auto& t : tensors) {
      std::vector<torch::Tensor> v{t.detach()};
      group_->pg->broadcast(v)->wait();
      torch::autograd::impl::bump_version(t);  // written in place (util/matmul.h's copies)
    }
  });
}

void Distributed::barrier() {
  run("barrier", [&] { group_->pg->barrier()->wait(); });
}

torch::Tensor Distributed::all_to_all(const torch::Tensor& input, const std::vector<int64_t>& send,
                                      const std::vector<int64_t>& recv) {
  const auto world = static_cast<size_t>(env_.world_size);
  TORCH_CHECK(send.size() == world && recv.size() == world, "all_to_all: ", world,
              " block sizes each way expected");
  int64_t rows_in = 0, rows_out = 0;
  for (size_t q = 0; q < world; ++q) rows_in += send[q], rows_out += recv[q];
  TORCH_CHECK(input.size(0) == rows_in, "all_to_all: input has ", input.size(0), " rows, blocks ",
              rows_in);
  if (!group_) return input;
  std::vector<int64_t> out_shape = input.sizes().vec();
  out_shape[0] = rows_out;
  torch::Tensor out = torch::empty(out_shape, input.options());
  torch::Tensor in = input.contiguous();
  run("all-to-all", [&] {
    std::vector<int64_t> out_splits = recv, in_splits = send;
    group_->pg->alltoall_base(out, in, out_splits, in_splits)->wait();
  });
  return out;
}

torch::Tensor Distributed::gather_to_main(const torch::Tensor& t) {
  if (!group_) return t.unsqueeze(0);
  const torch::Tensor in = t.contiguous();
  std::vector<std::vector<torch::Tensor>> out;
  torch::Tensor all;  // [world, ...] on rank 0, each rank's part written in place
  if (is_main()) {
    std::vector<int64_t> shape{env_.world_size};
    for (int64_t d : in.sizes()) shape.push_back(d);
    all = torch::empty(shape, in.options());
    out.emplace_back();
    for (int r = 0; r < env_.world_size; ++r) out[0].push_back(all[r]);
  }
  run("gather", [&] {
    std::vector<torch::Tensor> v{in};
    group_->pg->gather(out, v)->wait();
  });
  return all;
}

std::unique_ptr<Distributed> Distributed::subgroup(const std::string& name,
                                                   const std::vector<int>& ranks) {
  const auto me = std::find(ranks.begin(), ranks.end(), env_.rank);
  TORCH_CHECK(me != ranks.end(), "subgroup ", name, ": rank ", env_.rank, " is not a member");
  TORCH_CHECK(job_ranks_.empty(), "subgroup ", name, ": groups are made from the whole job");
  auto sub = std::make_unique<Distributed>();
  sub->env_ = env_;
  sub->env_.rank = static_cast<int>(me - ranks.begin());
  sub->env_.world_size = static_cast<int>(ranks.size());
  sub->timeout_ = timeout_;
  sub->job_ranks_ = ranks;
  sub->job_world_ = env_.world_size;
  if (ranks.size() < 2 || !group_) return sub;  // a group of one: collectives do nothing
  sub->group_ = std::make_unique<Group>();
  try {
    sub->group_->store = c10::make_intrusive<c10d::PrefixStore>(name, group_->store);
    sub->group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        sub->group_->store, sub->env_.rank, sub->env_.world_size, gloo_options(env_, timeout_));
  } catch (const std::exception& e) {
    throw DistError(fmt::format("{}: could not form the group '{}' of ranks {} within {} s: {}",
                                who(), name, fmt::join(ranks, ", "), timeout_.count() / 1000.0,
                                e.what()));
  }
  return sub;
}

}  // namespace minimind
