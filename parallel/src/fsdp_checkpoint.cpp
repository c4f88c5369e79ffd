#include <hyflow/core/error.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>

#include <torch/torch.h>

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

// Writes this shard rank's file of `kind` (a writer only) and returns the list of every shard
// rank's {shard_rank, file, bytes, fnv1a64} (on every rank; gathered over the shard group).
Json write_shard_file(const FsdpModule& module, const fs::path& dir, const char* kind, const std::string& bytes,
                      bool writer) {
  const auto& mesh = module.mesh();
  const int S = mesh.shard_size(), r = mesh.shard_rank();
  const uint64_t checksum = fnv1a(bytes.data(), bytes.size());
  if (writer) write_atomically(dir / shard_name(kind, r, S), bytes);
  // the bits of a uint64 carried as int64
  auto sums = torch::tensor({static_cast<int64_t>(checksum), static_cast<int64_t>(bytes.size())}, torch::kLong);
  std::vector<at::Tensor> all{sums};
  if (mesh.shard) all = mesh.shard->all_gather(sums);
  Json files = Json::array();
  for (int s = 0; s < S; ++s)
    files.push_back({{"shard_rank", s},
                     {"file", shard_name(kind, s, S)},
                     {"bytes", all[static_cast<size_t>(s)][1].item<int64_t>()},
                     {"fnv1a64", static_cast<uint64_t>(all[static_cast<size_t>(s)][0].item<int64_t>())}});
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

// Reads every file of a "shards" list, checking sizes and checksums; indexed by shard rank.
std::vector<std::string> read_shard_files(const fs::path& dir, const Json& files, const fs::path& mfile) {
  if (!files.is_array() || files.empty()) throw FormatError("'" + mfile.string() + "': 'shards' must be a list");
  const int64_t S = static_cast<int64_t>(files.size());
  std::vector<std::string> data(files.size());
  std::vector<bool> seen(files.size(), false);
  for (const auto& f : files) {
    const auto s = field<int64_t>(f, "shard_rank", mfile);
    if (s < 0 || s >= S || seen[static_cast<size_t>(s)])
      throw FormatError("'" + mfile.string() + "': shard_rank " + std::to_string(s) + " out of range or repeated");
    seen[static_cast<size_t>(s)] = true;
    const fs::path file = dir / field<std::string>(f, "file", mfile);
    auto& bytes = data[static_cast<size_t>(s)];
    bytes = read_all(file);
    const auto expected = field<uint64_t>(f, "bytes", mfile);
    if (bytes.size() != expected)
      throw FormatError("'" + file.string() + "' has " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                        std::to_string(expected));
    if (fnv1a(bytes.data(), bytes.size()) != field<uint64_t>(f, "fnv1a64", mfile))
      throw FormatError("'" + file.string() + "' fails its checksum (fnv1a64 in " + mfile.filename().string() + ")");
  }
  return data;
}

// One parameter of the manifest.
struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t rows = 0, per = 0, offset = 0, row_numel = 0;
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

// The full tensor of parameter `e` from the shard files' bytes at `base` + its offset.
at::Tensor assemble(const ParamEntry& e, const std::vector<std::string>& data, size_t base, const Json& files,
                    const fs::path& dir) {
  const int64_t S = static_cast<int64_t>(data.size());
  auto full = torch::empty({e.rows, e.row_numel}, torch::kFloat);
  const size_t bytes = static_cast<size_t>(e.per * e.row_numel) * sizeof(float);
  for (int64_t s = 0; s < S; ++s) {
    const auto& shard = data[static_cast<size_t>(s)];
    if (base + static_cast<size_t>(e.offset) + bytes > shard.size()) {
      std::string file;
      for (const auto& f : files)
        if (f.at("shard_rank") == s) file = f.at("file").get<std::string>();
      throw FormatError("'" + (dir / file).string() + "' ends before parameter '" + e.name + "' (offset " +
                        std::to_string(base + static_cast<size_t>(e.offset)) + ")");
    }
    const int64_t begin = std::min(s * e.per, e.rows), count = std::min(begin + e.per, e.rows) - begin;
    if (count <= 0) continue;
    std::memcpy(full.narrow(0, begin, count).data_ptr(), shard.data() + base + e.offset,
                static_cast<size_t>(count * e.row_numel) * sizeof(float));
  }
  return full.view(e.shape);
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
  Json parameters = Json::array();
  for (size_t i = 0; i < infos.size(); ++i) {
    parameters.push_back({{"name", infos[i].name},
                          {"shape", infos[i].full_shape},
                          {"dtype", dtype_name(infos[i].dtype)},
                          {"rows", infos[i].rows},
                          {"rows_per_shard", infos[i].rows_per_shard},
                          {"offset", bytes.size()}});
    append_floats(bytes, shards[i], shards[i].numel());
  }
  const Json files = write_shard_file(module, dir, "model", bytes, writer);
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
    manifest["optimizer"] = {{"name", "adamw"},
                             {"scheduler_steps", optimizer->scheduler_steps()},
                             {"steps", steps},
                             {"shards", write_shard_file(module, dir, "optim", moments, writer)}};
  }
  if (writer && mesh.shard_rank() == 0) write_atomically(manifest_file(dir), manifest.dump(2) + "\n");
  if (world) world->barrier();
}

bool is_sharded_checkpoint(const fs::path& dir) {
  return fs::is_regular_file(manifest_file(dir));
}

std::vector<NamedParameter> load_sharded_parameters(const fs::path& dir, Json* extra) {
  const fs::path mfile = manifest_file(dir);
  const Json manifest = read_manifest(dir);
  const Json files = field<Json>(manifest, "shards", mfile);
  const auto data = read_shard_files(dir, files, mfile);
  std::vector<NamedParameter> out;
  for (const auto& e : read_params(manifest, mfile, static_cast<int64_t>(data.size())))
    out.push_back({e.name, assemble(e, data, 0, files, dir)});
  if (extra) *extra = manifest.contains("extra") ? manifest.at("extra") : Json();
  return out;
}

FullOptimizerState load_sharded_optimizer(const fs::path& dir) {
  const fs::path mfile = manifest_file(dir);
  const Json manifest = read_manifest(dir);
  if (!manifest.contains("optimizer"))
    throw FormatError("'" + mfile.string() + "' has no optimizer state (saved without 'optimizer' in save_contents)");
  const Json& opt = manifest.at("optimizer");
  const Json files = field<Json>(opt, "shards", mfile);
  const auto steps = field<std::vector<int64_t>>(opt, "steps", mfile);
  const auto data = read_shard_files(dir, files, mfile);
  const auto params = read_params(manifest, mfile, static_cast<int64_t>(data.size()));
  if (steps.size() != params.size())
    throw FormatError("'" + mfile.string() + "': optimizer 'steps' has " + std::to_string(steps.size()) +
                      " entries for " + std::to_string(params.size()) + " parameters");
  // exp_avg_sq starts after the exp_avg block, which has the size of a model shard
  size_t half = 0;
  for (const auto& e : params) half += static_cast<size_t>(e.per * e.row_numel) * sizeof(float);
  FullOptimizerState out;
  out.scheduler_steps = field<int64_t>(opt, "scheduler_steps", mfile);
  for (size_t i = 0; i < params.size(); ++i) {
    AdamState st;
    if (steps[i] > 0) {
      st.exp_avg = assemble(params[i], data, 0, files, dir);
      st.exp_avg_sq = assemble(params[i], data, half, files, dir);
      st.step = steps[i];
    }
    out.parameters.push_back({params[i].name, std::move(st)});
  }
  return out;
}

}  // namespace hyflow::parallel
