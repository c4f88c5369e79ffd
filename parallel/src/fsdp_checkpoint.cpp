#include <hyflow/core/error.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace hyflow::parallel {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

static_assert(std::endian::native == std::endian::little, "shard files are little-endian float32");

constexpr const char* kFormat = "hyflow-fsdp-v1";

fs::path manifest_file(const fs::path& dir) {
  return dir / "fsdp_manifest.json";
}

std::string shard_name(const char* kind, int shard_rank, int shard_size) {
  return std::string(kind) + "_shard_" + std::to_string(shard_rank) + "_of_" + std::to_string(shard_size) + ".bin";
}

uint64_t fnv1a(const char* data, size_t n) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      return c10::toString(t);
  }
}

// Writes `bytes` to `file` through a temporary name and a rename.
void write_atomically(const fs::path& file, const std::string& bytes) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw Error("cannot write '" + tmp.string() + "'");
  }
  fs::rename(tmp, file);
}

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FormatError("sharded checkpoint: missing file '" + file.string() + "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <class T>
T field(const Json& j, const char* key, const fs::path& file) {
  if (!j.is_object() || !j.contains(key)) throw FormatError("'" + file.string() + "': missing '" + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const Json::exception& e) {
    throw FormatError("'" + file.string() + "': bad '" + key + "': " + e.what());
  }
}

void append_floats(std::string& bytes, const at::Tensor& t, int64_t numel) {
  if (!t.defined()) {
    bytes.append(static_cast<size_t>(numel) * sizeof(float), '\0');
    return;
  }
  auto data = t.detach().to(at::kCPU, at::kFloat).contiguous();
  if (data.numel() != numel)
    throw ShapeError("sharded checkpoint: a tensor of " + std::to_string(data.numel()) +
                     " values where the shard has " + std::to_string(numel));
  bytes.append(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(numel) * sizeof(float));
}

// fnv1a64 of each block [offsets[i], offsets[i + 1]) of `bytes`.
std::vector<uint64_t> block_sums(const std::string& bytes, const std::vector<size_t>& offsets) {
  std::vector<uint64_t> sums;
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    sums.push_back(fnv1a(bytes.data() + offsets[i], offsets[i + 1] - offsets[i]));
  return sums;
}

// Writes this shard rank's file of `kind` (a writer only) and returns the list of every shard
// rank's {shard_rank, file, bytes, fnv1a64, blocks} (on every rank; gathered over the shard
// group): `blocks` holds the fnv1a64 of each parameter's block, so that a reader can check the
// rows it reads without reading the whole file.
Json write_shard_file(const FsdpModule& module, const fs::path& dir, const char* kind, const std::string& bytes,
                      const std::vector<size_t>& offsets, bool writer) {
  const auto& mesh = module.mesh();
  const int S = mesh.shard_size(), r = mesh.shard_rank();
  const uint64_t checksum = fnv1a(bytes.data(), bytes.size());
  if (writer) write_atomically(dir / shard_name(kind, r, S), bytes);
  // the bits of each uint64 carried as int64
  std::vector<int64_t> values{static_cast<int64_t>(checksum), static_cast<int64_t>(bytes.size())};
  for (uint64_t sum : block_sums(bytes, offsets)) values.push_back(static_cast<int64_t>(sum));
  auto sums = torch::tensor(values, torch::kLong);
  std::vector<at::Tensor> all{sums};
  if (mesh.shard) all = mesh.shard->all_gather(sums);
  Json files = Json::array();
  for (int s = 0; s < S; ++s) {
    const auto& v = all[static_cast<size_t>(s)];
    Json blocks = Json::array();
    for (int64_t b = 2; b < v.numel(); ++b) blocks.push_back(static_cast<uint64_t>(v[b].item<int64_t>()));
    files.push_back({{"shard_rank", s},
                     {"file", shard_name(kind, s, S)},
                     {"bytes", v[1].item<int64_t>()},
                     {"fnv1a64", static_cast<uint64_t>(v[0].item<int64_t>())},
                     {"blocks", blocks}});
  }
  return files;
}

Json read_manifest(const fs::path& dir) {
  const fs::path mfile = manifest_file(dir);
  Json manifest;
  try {
    manifest = Json::parse(read_all(mfile));
  } catch (const Json::exception& e) {
    throw FormatError("'" + mfile.string() + "' is not JSON: " + e.what());
  }
  if (field<std::string>(manifest, "format", mfile) != kFormat)
    throw FormatError("'" + mfile.string() + "' has format " + manifest.at("format").dump() + ", expected " + kFormat);
  return manifest;
}

// One shard file of a "shards" list: its path, size and checksums (`blocks` empty in
// checkpoints written before per-block checksums: such files are read and checked whole).
struct ShardFile {
  fs::path path;
  uint64_t bytes = 0, fnv1a64 = 0;
  std::vector<uint64_t> blocks;
};

// The files of a "shards" list indexed by shard rank; FormatError naming the manifest when the
// list is malformed.
std::vector<ShardFile> shard_files(const fs::path& dir, const Json& files, const fs::path& mfile, size_t block_count) {
  if (!files.is_array() || files.empty()) throw FormatError("'" + mfile.string() + "': 'shards' must be a list");
  const int64_t S = static_cast<int64_t>(files.size());
  std::vector<ShardFile> out(files.size());
  std::vector<bool> seen(files.size(), false);
  for (const auto& f : files) {
    const auto s = field<int64_t>(f, "shard_rank", mfile);
    if (s < 0 || s >= S || seen[static_cast<size_t>(s)])
      throw FormatError("'" + mfile.string() + "': shard_rank " + std::to_string(s) + " out of range or repeated");
    seen[static_cast<size_t>(s)] = true;
    auto& file = out[static_cast<size_t>(s)];
    file.path = dir / field<std::string>(f, "file", mfile);
    file.bytes = field<uint64_t>(f, "bytes", mfile);
    file.fnv1a64 = field<uint64_t>(f, "fnv1a64", mfile);
    if (f.contains("blocks")) file.blocks = field<std::vector<uint64_t>>(f, "blocks", mfile);
    if (!file.blocks.empty() && file.blocks.size() != block_count)
      throw FormatError("'" + mfile.string() + "': '" + file.path.filename().string() + "' has " +
                        std::to_string(file.blocks.size()) + " block checksums for " + std::to_string(block_count) +
                        " blocks");
  }
  return out;
}

// FormatError naming the file when it is missing or its size is not the manifest's.
void check_size(const ShardFile& file) {
  std::error_code error;
  const auto size = fs::file_size(file.path, error);
  if (error) throw FormatError("sharded checkpoint: missing file '" + file.path.string() + "'");
  if (size != file.bytes)
    throw FormatError("'" + file.path.string() + "' has " + std::to_string(size) + " bytes, the manifest says " +
                      std::to_string(file.bytes));
}

// One parameter of the manifest.
struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t rows = 0, per = 0, offset = 0, row_numel = 0;
  size_t block_bytes() const { return static_cast<size_t>(per * row_numel) * sizeof(float); }
};

std::vector<ParamEntry> read_params(const Json& manifest, const fs::path& mfile, int64_t S) {
  const Json params = field<Json>(manifest, "parameters", mfile);
  if (!params.is_array()) throw FormatError("'" + mfile.string() + "': 'parameters' must be a list");
  std::vector<ParamEntry> out;
  for (const auto& p : params) {
    ParamEntry e;
    e.name = field<std::string>(p, "name", mfile);
    e.shape = field<std::vector<int64_t>>(p, "shape", mfile);
    e.rows = field<int64_t>(p, "rows", mfile);
    e.per = field<int64_t>(p, "rows_per_shard", mfile);
    e.offset = field<int64_t>(p, "offset", mfile);
    int64_t numel = 1;
    for (auto d : e.shape) numel *= d;
    e.row_numel = e.rows == 0 ? 0 : numel / e.rows;
    if (e.rows < 0 || e.per < 0 || e.offset < 0 || e.per * S < e.rows || e.rows * e.row_numel != numel)
      throw FormatError("'" + mfile.string() + "': parameter '" + e.name + "' has inconsistent rows");
    out.push_back(std::move(e));
  }
  return out;
}

// Rows [begin, end) of a saved tensor (parameter `e`'s rows in the block `block` of each shard
// file, at byte `base` + e.offset) wanted in `dest` ((end - begin) x row_numel float32).
struct RowRequest {
  const ParamEntry* e = nullptr;
  size_t block = 0, base = 0;
  int64_t begin = 0, end = 0;
  at::Tensor dest;
};

// Copies the rows of `shard`'s block (rows [s per, (s + 1) per) of the tensor) that `r` wants.
void copy_overlap(const RowRequest& r, int64_t s, const char* block) {
  const auto& e = *r.e;
  const int64_t begin = std::max(s * e.per, r.begin), end = std::min({(s + 1) * e.per, e.rows, r.end});
  if (end <= begin) return;
  std::memcpy(r.dest.narrow(0, begin - r.begin, end - begin).data_ptr(),
              block + static_cast<size_t>((begin - s * e.per) * e.row_numel) * sizeof(float),
              static_cast<size_t>((end - begin) * e.row_numel) * sizeof(float));
}

bool overlaps(const RowRequest& r, int64_t s) {
  const auto& e = *r.e;
  return std::max(s * e.per, r.begin) < std::min({(s + 1) * e.per, e.rows, r.end});
}

// Serves `requests` from the shard files, one file at a time. With per-block checksums each
// needed block is read by offset and checked alone (a rank reads the blocks of the files whose
// rows overlap its own; the extra memory is one block); an older file is read and checked whole.
// FormatError naming the file (and the parameter and offset) when it is short or a checksum fails.
void read_rows(const std::vector<ShardFile>& files, const std::vector<RowRequest>& requests) {
  for (size_t s = 0; s < files.size(); ++s) {
    const auto& file = files[s];
    const auto shard = static_cast<int64_t>(s);
    std::vector<const RowRequest*> wanted;
    for (const auto& r : requests)
      if (overlaps(r, shard)) wanted.push_back(&r);
    if (wanted.empty()) continue;  // a file this rank needs no row of is not opened
    check_size(file);
    auto check_span = [&](const RowRequest& r) {
      const size_t at = r.base + static_cast<size_t>(r.e->offset);
      if (at + r.e->block_bytes() > file.bytes)
        throw FormatError("'" + file.path.string() + "' ends before parameter '" + r.e->name + "' (offset " +
                          std::to_string(at) + ")");
      return at;
    };
    std::ifstream in(file.path, std::ios::binary);
    if (!in) throw FormatError("sharded checkpoint: missing file '" + file.path.string() + "'");
    if (file.blocks.empty()) {
      std::string bytes(std::istreambuf_iterator<char>(in), {});
      if (bytes.size() != file.bytes || fnv1a(bytes.data(), bytes.size()) != file.fnv1a64)
        throw FormatError("'" + file.path.string() + "' fails its checksum (fnv1a64 in the manifest)");
      for (const auto* r : wanted) copy_overlap(*r, shard, bytes.data() + check_span(*r));
      continue;
    }
    std::string block;
    for (const auto* r : wanted) {
      const size_t at = check_span(*r);
      block.resize(r->e->block_bytes());
      in.seekg(static_cast<std::streamoff>(at));
      in.read(block.data(), static_cast<std::streamsize>(block.size()));
      if (!in)
        throw FormatError("'" + file.path.string() + "' ends before parameter '" + r->e->name + "' (offset " +
                          std::to_string(at) + ")");
      if (fnv1a(block.data(), block.size()) != file.blocks[r->block])
        throw FormatError("'" + file.path.string() + "' fails its checksum for parameter '" + r->e->name +
                          "' (the block at offset " + std::to_string(at) + ", fnv1a64 in the manifest)");
      copy_overlap(*r, shard, block.data());
    }
  }
}

// What a loader needs of a checkpoint's model or optimizer part.
struct Part {
  fs::path mfile;
  Json manifest;
  std::vector<ShardFile> files;
  std::vector<ParamEntry> params;
};

Part model_part(const fs::path& dir) {
  Part part;
  part.mfile = manifest_file(dir);
  part.manifest = read_manifest(dir);
  const Json files = field<Json>(part.manifest, "shards", part.mfile);
  const auto S = static_cast<int64_t>(files.is_array() ? files.size() : 0);
  part.params = read_params(part.manifest, part.mfile, std::max<int64_t>(S, 1));
  part.files = shard_files(dir, files, part.mfile, part.params.size());
  return part;
}

// The optimizer part and its per-parameter step counts; its blocks are the exp_avg blocks of
// every parameter, then the exp_avg_sq blocks (at `half`, the size of a model shard).
Part optimizer_part(const fs::path& dir, std::vector<int64_t>* steps, int64_t* scheduler_steps, size_t* half) {
  Part part;
  part.mfile = manifest_file(dir);
  part.manifest = read_manifest(dir);
  if (!part.manifest.contains("optimizer"))
    throw FormatError("'" + part.mfile.string() +
                      "' has no optimizer state (saved without 'optimizer' in save_contents)");
  const Json& opt = part.manifest.at("optimizer");
  const Json files = field<Json>(opt, "shards", part.mfile);
  *steps = field<std::vector<int64_t>>(opt, "steps", part.mfile);
  *scheduler_steps = field<int64_t>(opt, "scheduler_steps", part.mfile);
  const auto S = static_cast<int64_t>(files.is_array() ? files.size() : 0);
  part.params = read_params(part.manifest, part.mfile, std::max<int64_t>(S, 1));
  if (steps->size() != part.params.size())
    throw FormatError("'" + part.mfile.string() + "': optimizer 'steps' has " + std::to_string(steps->size()) +
                      " entries for " + std::to_string(part.params.size()) + " parameters");
  *half = 0;
  for (const auto& e : part.params) *half += e.block_bytes();
  part.files = shard_files(dir, files, part.mfile, 2 * part.params.size());
  return part;
}

// The manifest entry of each of `module`'s parameters (shard_infos order); KeyError / ShapeError
// naming the directory and the parameter.
std::vector<size_t> match(const Part& part, const std::vector<FsdpModule::ShardInfo>& infos, const fs::path& dir,
                          const char* what) {
  std::vector<size_t> out;
  for (const auto& info : infos) {
    size_t k = 0;
    while (k < part.params.size() && part.params[k].name != info.name) ++k;
    if (k == part.params.size()) throw KeyError("'" + dir.string() + "': no " + what + " '" + info.name + "'");
    if (part.params[k].shape != info.full_shape)
      throw ShapeError("'" + dir.string() + "': tensor '" + info.name + "' has shape " +
                       c10::str(c10::IntArrayRef(part.params[k].shape)) + ", the model has " +
                       c10::str(c10::IntArrayRef(info.full_shape)));
    out.push_back(k);
  }
  return out;
}

// This rank's real rows [r k, min((r + 1) k, rows)) of a parameter sharded `k` rows per rank.
std::pair<int64_t, int64_t> my_rows(const FsdpModule::ShardInfo& info, int64_t r) {
  const int64_t begin = std::min(r * info.rows_per_shard, info.rows);
  return {begin, std::min(begin + info.rows_per_shard, info.rows)};
}

}  // namespace

void save_sharded_parameters(const FsdpModule& module, const fs::path& dir, const Json& extra, ProcessGroup* world) {
  save_sharded_checkpoint(module, nullptr, dir, extra, world);
}

void save_sharded_checkpoint(const FsdpModule& module, const ShardedOptimizer* optimizer, const fs::path& dir,
                             const Json& extra, ProcessGroup* world) {
  const auto& mesh = module.mesh();
  const int S = mesh.shard_size();
  const bool writer = !mesh.replicate || mesh.replicate->rank() == 0;  // replicas hold equal shards
  fs::create_directories(dir);
  const auto infos = module.shard_infos();
  const auto shards = module.local_shards();
  std::string bytes;
  std::vector<size_t> offsets;  // each parameter's block, then the end
  Json parameters = Json::array();
  for (size_t i = 0; i < infos.size(); ++i) {
    offsets.push_back(bytes.size());
    parameters.push_back({{"name", infos[i].name},
                          {"shape", infos[i].full_shape},
                          {"dtype", dtype_name(infos[i].dtype)},
                          {"rows", infos[i].rows},
                          {"rows_per_shard", infos[i].rows_per_shard},
                          {"offset", bytes.size()}});
    append_floats(bytes, shards[i], shards[i].numel());
  }
  offsets.push_back(bytes.size());
  const Json files = write_shard_file(module, dir, "model", bytes, offsets, writer);
  Json manifest = {{"format", kFormat},
                   {"world_size", world ? world->size() : 1},
                   {"mesh", {{"shard_size", S}, {"replicate_size", mesh.replicate_size()}}},
                   {"extra", extra},
                   {"parameters", parameters},
                   {"shards", files}};
  if (optimizer) {
    const auto state = optimizer->shard_state();
    if (state.size() != infos.size())
      throw Error("save_sharded_checkpoint: the optimizer has state for " + std::to_string(state.size()) +
                  " parameters, the module " + std::to_string(infos.size()));
    std::string moments;
    moments.reserve(2 * bytes.size());
    for (size_t i = 0; i < infos.size(); ++i) append_floats(moments, state[i].exp_avg, shards[i].numel());
    for (size_t i = 0; i < infos.size(); ++i) append_floats(moments, state[i].exp_avg_sq, shards[i].numel());
    Json steps = Json::array();
    for (const auto& st : state) steps.push_back(st.exp_avg.defined() ? st.step : 0);
    std::vector<size_t> moment_offsets = offsets;  // the exp_avg blocks, then the exp_avg_sq blocks
    for (size_t i = 1; i < offsets.size(); ++i) moment_offsets.push_back(bytes.size() + offsets[i]);
    manifest["optimizer"] = {{"name", "adamw"},
                             {"scheduler_steps", optimizer->scheduler_steps()},
                             {"steps", steps},
                             {"shards", write_shard_file(module, dir, "optim", moments, moment_offsets, writer)}};
  }
  if (writer && mesh.shard_rank() == 0) write_atomically(manifest_file(dir), manifest.dump(2) + "\n");
  if (world) world->barrier();
}

bool is_sharded_checkpoint(const fs::path& dir) {
  return fs::is_regular_file(manifest_file(dir));
}

std::vector<NamedParameter> load_sharded_parameters(const fs::path& dir, Json* extra) {
  const Part part = model_part(dir);
  std::vector<NamedParameter> out;
  std::vector<RowRequest> requests;
  for (size_t i = 0; i < part.params.size(); ++i) {
    const auto& e = part.params[i];
    auto full = torch::empty({e.rows, e.row_numel}, torch::kFloat);
    requests.push_back({&e, i, 0, 0, e.rows, full});
    out.push_back({e.name, full.view(e.shape)});
  }
  read_rows(part.files, requests);
  if (extra) *extra = part.manifest.contains("extra") ? part.manifest.at("extra") : Json();
  return out;
}

FullOptimizerState load_sharded_optimizer(const fs::path& dir) {
  std::vector<int64_t> steps;
  FullOptimizerState out;
  size_t half = 0;
  const Part part = optimizer_part(dir, &steps, &out.scheduler_steps, &half);
  const size_t P = part.params.size();
  std::vector<RowRequest> requests;
  for (size_t i = 0; i < P; ++i) {
    const auto& e = part.params[i];
    AdamState st;
    if (steps[i] > 0) {
      st.exp_avg = torch::empty({e.rows, e.row_numel}, torch::kFloat);
      st.exp_avg_sq = torch::empty({e.rows, e.row_numel}, torch::kFloat);
      requests.push_back({&e, i, 0, 0, e.rows, st.exp_avg});
      requests.push_back({&e, P + i, half, 0, e.rows, st.exp_avg_sq});
      st.exp_avg = st.exp_avg.view(e.shape);
      st.exp_avg_sq = st.exp_avg_sq.view(e.shape);
      st.step = steps[i];
    }
    out.parameters.push_back({e.name, std::move(st)});
  }
  read_rows(part.files, requests);
  return out;
}

void load_sharded_parameters(FsdpModule& module, const fs::path& dir) {
  const Part part = model_part(dir);
  const auto infos = module.shard_infos();
  const auto entries = match(part, infos, dir, "parameter");
  const int64_t r = module.mesh().shard_rank();
  module.load_local_rows([&](const std::vector<at::Tensor>& rows) {
    std::vector<RowRequest> requests;
    for (size_t i = 0; i < infos.size(); ++i) {
      const auto [begin, end] = my_rows(infos[i], r);
      requests.push_back({&part.params[entries[i]], entries[i], 0, begin, end, rows[i]});
    }
    read_rows(part.files, requests);
  });
}

void load_sharded_optimizer(ShardedOptimizer& optimizer, const FsdpModule& module, const fs::path& dir) {
  std::vector<int64_t> steps;
  int64_t scheduler_steps = 0;
  size_t half = 0;
  const Part part = optimizer_part(dir, &steps, &scheduler_steps, &half);
  const auto infos = module.shard_infos();
  const auto entries = match(part, infos, dir, "optimizer state for parameter");
  const int64_t r = module.mesh().shard_rank();
  const size_t P = part.params.size();
  std::vector<AdamState> mine(infos.size());
  std::vector<RowRequest> requests;
  for (size_t i = 0; i < infos.size(); ++i) {
    const size_t k = entries[i];
    if (steps[k] <= 0) continue;
    const auto& e = part.params[k];
    const auto [begin, end] = my_rows(infos[i], r);
    auto& st = mine[i];
    st.exp_avg = torch::zeros({infos[i].rows_per_shard, e.row_numel}, torch::kFloat);  // padding rows stay 0
    st.exp_avg_sq = torch::zeros({infos[i].rows_per_shard, e.row_numel}, torch::kFloat);
    st.step = steps[k];
    requests.push_back({&e, k, 0, begin, end, st.exp_avg.narrow(0, 0, end - begin)});
    requests.push_back({&e, P + k, half, begin, end, st.exp_avg_sq.narrow(0, 0, end - begin)});
  }
  read_rows(part.files, requests);
  for (auto& st : mine)
    if (st.exp_avg.defined()) {
      st.exp_avg = st.exp_avg.view({-1});
      st.exp_avg_sq = st.exp_avg_sq.view({-1});
    }
  optimizer.load_shard_state(mine, scheduler_steps, "optimizer state of '" + dir.string() + "'");
}

}  // namespace hyflow::parallel
