#include "sim/replay/replay_run.hpp"

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/partial_files.hpp"
#include "sim/replay/bounds.hpp"
#include "sim/replay/replay_checkpoint.hpp"
#include "sim/replay/results.hpp"
#include "sim/replay/sweep.hpp"
#include "sim/run/note_tally.hpp"

namespace kvsim {

bool ReplayOutputs::any() const {
  return !steps_csv.empty() || !summary_csv.empty() || !decisions_h5.empty() || !bounds_csv.empty();
}

std::string ReplayOutputs::checkpoint_dir() const {
  if (!checkpoint.empty()) return checkpoint;
  for (const std::string* p : {&steps_csv, &summary_csv, &bounds_csv, &decisions_h5})
    if (!p->empty()) return *p + ".checkpoint";
  return "";
}

std::string replay_manifest(const std::string& trace_hash,
                            const std::vector<PolicyConfig>& policies, const ReplayOptions& options,
                            const ReplayOutputs& outputs) {
  std::ostringstream m;
  m << "kvsim replay checkpoint\nkvsim " KVSIM_VERSION "\ntrace " << trace_hash << "\n";
  for (const auto& p : policies)
    m << "policy " << p.label << " = " << p.info->name << " " << p.params.str() << "\n";
  std::vector<std::string> metrics = options.metrics;
  std::sort(metrics.begin(), metrics.end());
  metrics.erase(std::unique(metrics.begin(), metrics.end()), metrics.end());
  m << "metrics";
  for (const std::string& name : metrics) m << " " << name;
  m << "\n";
  if (options.prompt_tail != 0)
    m << "prompt tail " << prompt_tail_text(options.prompt_tail) << "\n";
  for (const LayerCheck& c : options.checks) m << "check " << c.name << "\n";
  m << "outputs steps=" << !outputs.steps_csv.empty() << " bounds=" << !outputs.bounds_csv.empty()
    << " decisions=" << !outputs.decisions_h5.empty() << "\n";
  return m.str();
}

namespace {

constexpr const char* kBoundsLine = "bounds ";
constexpr const char* kNoteLine = "note ";  // a policy's note while replaying: index, then text

// One sample's results while it is replayed: files in the checkpoint, its summary in memory.
struct SampleSink {
  SampleSink(const std::string& sample, int index, const std::vector<PolicyConfig>& policies,
             const ReplayOutputs& outputs, const ReplayCheckpoint* checkpoint, double epsilon)
      : name(sample), index(index), summary(policies) {
    if (!checkpoint) return;
    if (!outputs.steps_csv.empty())
      steps = std::make_unique<StepCsvWriter>(checkpoint->file(index, "steps.csv"), policies);
    if (!outputs.bounds_csv.empty())
      bounds = std::make_unique<BoundsCsvWriter>(checkpoint->file(index, "bounds.csv"), policies,
                                                 epsilon);
    if (!outputs.decisions_h5.empty())
      decisions =
          std::make_unique<DecisionWriter>(checkpoint->file(index, "decisions.h5"), policies);
  }
  void add(const LayerResult& r) {
    for (const std::string& n : r.notes)
      notes += kNoteLine + std::to_string(r.policy_index) + " " + note_on_one_line(n) + "\n";
    summary.add(r);
    if (steps) steps->write(r);
    if (bounds) bounds->write(r);
    if (decisions) decisions->write(r);
  }
  // Closes the files and returns what the checkpoint keeps besides them.
  std::string finish() {
    std::string state = summary.sample_state(name) + notes;
    if (steps) steps->close();
    if (decisions) decisions->close();
    if (bounds) {
      bounds->close();
      state += kBoundsLine + std::to_string(bounds->theorem_rows) + " " +
               std::to_string(bounds->theorem_failures) + " " + std::to_string(bounds->flushes) +
               " " + std::to_string(bounds->corollary_failures) + "\n";
    }
    return state;
  }
  std::string name;
  int index;
  std::string notes;  // kNoteLine lines
  Summary summary;
  std::unique_ptr<StepCsvWriter> steps;
  std::unique_ptr<BoundsCsvWriter> bounds;
  std::unique_ptr<DecisionWriter> decisions;
};

// A chunk-concatenating output: the header once, then each sample's file without its header.
class Concatenation {
 public:
  Concatenation(const std::string& path, const std::string& header)
      : path_(path), file_(open_partial(path)) {
    std::fputs(header.c_str(), file_);
  }
  ~Concatenation() {
    if (file_) std::fclose(file_);
  }
  void append(const std::string& chunk) { append_file(file_, path_, chunk, true); }
  void close() {
    const bool ok = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!ok) throw std::runtime_error(path_ + ": write failed (disk full?)");
    publish(path_);
  }

 private:
  std::string path_;
  std::FILE* file_;
};

}  // namespace

namespace {

// Each sample's place in the trace (it names the sample's checkpoint files); throws when
// `samples` names one twice.
std::map<std::string, int> sample_index(const TraceReader& reader,
                                        const std::vector<std::string>& samples) {
  std::map<std::string, int> index;
  for (const auto& name : reader.sample_names())
    index.emplace(name, static_cast<int>(index.size()));
  std::set<std::string> seen;
  for (const auto& s : samples)
    if (!seen.insert(s).second)
      throw std::invalid_argument("sample '" + s + "' is given more than once");
  return index;
}

// A finished sample's state: its notes go to `noted`, its bound-check counts to `report`; returns
// the summary's lines.
std::string read_sample_state(const std::string& text, const std::string& sample, NoteTally& noted,
                              ReplayRunReport& report) {
  std::istringstream state(text);
  std::string line, summary_lines;
  while (std::getline(state, line)) {
    if (line.rfind(kNoteLine, 0) == 0) {
      std::istringstream in(line.substr(std::char_traits<char>::length(kNoteLine)));
      int policy = -1;
      std::string note;
      in >> policy;
      std::getline(in >> std::ws, note);
      noted.add(policy, sample, note);
      continue;
    }
    if (line.rfind(kBoundsLine, 0) != 0) {
      summary_lines += line + "\n";
      continue;
    }
    long counts[4] = {0, 0, 0, 0};
    std::istringstream(line.substr(std::char_traits<char>::length(kBoundsLine))) >> counts[0] >>
        counts[1] >> counts[2] >> counts[3];
    report.theorem_rows += counts[0];
    report.theorem_failures += counts[1];
    report.flushes += counts[2];
    report.corollary_failures += counts[3];
  }
  return summary_lines;
}

// Replays the samples not yet finished; each finished sample's state goes to the checkpoint, or
// without one to `states`.
void replay_unfinished(const TraceReader& reader, const std::vector<PolicyConfig>& policies,
                       const ReplayOptions& options, const std::vector<std::string>& todo,
                       const std::map<std::string, int>& index, const ReplayOutputs& outputs,
                       ReplayCheckpoint* checkpoint, std::map<int, std::string>& states,
                       const std::function<void()>& on_layer) {
  Replayer replayer(reader, policies, options);
  std::unique_ptr<SampleSink> sink;
  auto finish_sample = [&] {
    if (!sink) return;
    const std::string state = sink->finish();
    if (checkpoint)
      checkpoint->mark_finished(sink->index, state);
    else
      states[sink->index] = state;
    sink.reset();
  };
  replayer.replay_samples(
      todo,
      [&](const LayerResult& r) {
        if (!sink || sink->name != r.sample) {
          finish_sample();
          sink = std::make_unique<SampleSink>(r.sample, index.at(r.sample), policies, outputs,
                                              checkpoint, outputs.bounds_epsilon);
        }
        sink->add(r);
      },
      [&](int) {
        if (on_layer) on_layer();
      });
  finish_sample();
}

// Every sample is finished: the outputs, in the order the samples were asked for, and the
// report's table, sample means and notes.
void write_outputs(const TraceReader& reader, const std::vector<PolicyConfig>& policies,
                   const std::vector<std::string>& samples, const std::map<std::string, int>& index,
                   const ReplayOutputs& outputs,
                   const std::map<std::string, std::vector<std::string>>& notes,
                   const ReplayCheckpoint* checkpoint, const std::map<int, std::string>& states,
                   ReplayRunReport& report) {
  NoteTally noted;
  Summary summary(policies, reader.info().num_kv_heads);
  std::unique_ptr<Concatenation> steps, bounds;
  if (!outputs.steps_csv.empty())
    steps = std::make_unique<Concatenation>(outputs.steps_csv, StepCsvWriter::header());
  if (!outputs.bounds_csv.empty())
    bounds = std::make_unique<Concatenation>(outputs.bounds_csv, BoundsCsvWriter::header());
  std::unique_ptr<DecisionWriter> decisions;
  if (!outputs.decisions_h5.empty())
    decisions = std::make_unique<DecisionWriter>(outputs.decisions_h5, policies);
  for (const auto& s : samples) {
    const int i = index.at(s);
    const std::string origin = checkpoint ? checkpoint->file(i, "done") : s;
    const std::string summary_lines =
        read_sample_state(checkpoint ? checkpoint->state(i) : states.at(i), s, noted, report);
    summary.add_sample_state(s, summary_lines, origin);
    if (steps) steps->append(checkpoint->file(i, "steps.csv"));
    if (bounds) bounds->append(checkpoint->file(i, "bounds.csv"));
    if (decisions) decisions->copy_sample(checkpoint->file(i, "decisions.h5"), s);
  }
  auto all_notes = notes;
  for (const auto& [policy, note] : noted.lines(samples.size())) {
    report.notes.push_back(note);
    if (policy >= 0 && policy < static_cast<int>(policies.size()))
      all_notes[policies[policy].label].push_back(note);
  }
  if (steps) {
    steps->close();
    write_policies_sidecar(outputs.steps_csv, policies, all_notes);  // beside results that exist
  }
  if (bounds) bounds->close();
  if (decisions) decisions->close();
  if (!outputs.summary_csv.empty()) summary.write_csv(outputs.summary_csv);
  report.table = summary.table();
  report.sample_means = summary.sample_means();
}

}  // namespace

ReplayRunReport run_replay(const std::string& trace_path, const TraceReader& reader,
                           const std::vector<PolicyConfig>& policies, const ReplayOptions& options,
                           const std::vector<std::string>& samples, const ReplayOutputs& outputs,
                           const std::map<std::string, std::vector<std::string>>& notes,
                           const std::function<void()>& on_layer) {
  const std::map<std::string, int> index = sample_index(reader, samples);
  ReplayRunReport report;
  std::unique_ptr<ReplayCheckpoint> checkpoint;
  if (outputs.any()) {
    checkpoint = std::make_unique<ReplayCheckpoint>(
        outputs.checkpoint_dir(),
        replay_manifest(file_content_hash(trace_path), policies, options, outputs));
    report.checkpoint_dir = checkpoint->dir();
    set_interrupt_note("finished samples are kept in " + checkpoint->dir() +
                       "; rerun the same command to resume");
  }
  std::vector<std::string> todo;
  for (const auto& s : samples) {
    if (checkpoint && checkpoint->finished(index.at(s)))
      ++report.samples_resumed;
    else
      todo.push_back(s);
  }
  std::map<int, std::string> states;  // without a checkpoint: each sample's state, in memory
  replay_unfinished(reader, policies, options, todo, index, outputs, checkpoint.get(), states,
                    on_layer);
  write_outputs(reader, policies, samples, index, outputs, notes, checkpoint.get(), states, report);
  if (checkpoint) {
    set_interrupt_note("");
    checkpoint->remove();
  }
  return report;
}

}  // namespace kvsim
