// hybrid_train, first cut: trains the ConvNet on Fashion-MNIST on the CPU and reports test
// accuracy. The config-driven program (TOML, overrides, metrics, checkpoints) replaces this
// front end in the next issue; the pieces below it (interpreter, models, data) stay.
#include "launcher/data/fashion_mnist.h"
#include "launcher/user_error.h"
#include "models/convnet.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <unistd.h>

namespace ht {
namespace {

struct Options {
  std::string data_dir = kDefaultFashionMnistDir;
  int epochs = 1;
  int64_t batch = 64;
  double lr = 0.05;
  int threads = 0;
  uint64_t seed = 1;
};

double evaluate(Model& model, const ImageSet& test) {
  model.eval();
  Interpreter interp;
  NoGradGuard no_grad(interp);
  int64_t correct = 0;
  for (int64_t i = 0; i < test.images.size(0); i += 1000) {
    const int64_t n = std::min<int64_t>(1000, test.images.size(0) - i);
    at::Tensor logits = model.forward(interp.input(test.images.narrow(0, i, n))).value();
    correct += logits.argmax(1).eq(test.labels.narrow(0, i, n)).sum().item<int64_t>();
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test.images.size(0));
}

int run(const Options& o) {
  // libtorch defaults to physical cores (1 on a 2-vCPU machine), which leaves OpenBLAS's own
  // threads spinning; all hardware threads is faster here.
  at::set_num_threads(o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency()));
  const ImageSet train = load_fashion_mnist(o.data_dir, "train");
  const ImageSet test = load_fashion_mnist(o.data_dir, "test");
  at::manual_seed(static_cast<int64_t>(o.seed));
  auto model = std::make_shared<ConvNet>(ConvNetOptions{});
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(0.9));
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, o.seed});
  const int64_t steps_per_epoch = train.images.size(0) / o.batch;
  const bool tty = isatty(fileno(stdout));
  std::printf("hybrid_train: ConvNet (%lld parameters) on Fashion-MNIST, %d epoch(s) of %lld steps, "
              "batch %lld, %d thread(s)\n",
              static_cast<long long>(model->num_parameters()), o.epochs,
              static_cast<long long>(steps_per_epoch), static_cast<long long>(o.batch),
              at::get_num_threads());
  const auto start = std::chrono::steady_clock::now();
  at::Generator order_gen = at::detail::createCPUGenerator(o.seed);
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const at::Tensor order = at::randperm(train.images.size(0), order_gen, at::kLong);
    double loss_sum = 0;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      const at::Tensor idx = order.narrow(0, step * o.batch, o.batch);
      Tensor loss = model->loss(model->forward(interp.input(train.images.index_select(0, idx))),
                                interp.input(train.labels.index_select(0, idx)));
      interp.backward(loss);
      sgd.step();
      for (at::Tensor& p : model->parameters()) p.mutable_grad() = at::Tensor();
      loss_sum += loss.value().item<double>();
      const bool report = tty ? (step % 10 == 0) : (step % 200 == 0);
      if (report || step + 1 == steps_per_epoch) {
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf(tty ? "\repoch %d step %lld/%lld loss %.4f  %.0f samples/s " : "epoch %d step %lld/%lld loss %.4f  %.0f samples/s\n",
                    epoch + 1, static_cast<long long>(step + 1), static_cast<long long>(steps_per_epoch),
                    loss_sum / static_cast<double>(step + 1),
                    static_cast<double>((epoch * steps_per_epoch + step + 1) * o.batch) / secs);
        std::fflush(stdout);
      }
    }
    if (tty) std::printf("\n");
    std::printf("epoch %d: test accuracy %.4f\n", epoch + 1, evaluate(*model, test));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done in %.0f s\n", secs);
  return 0;
}

}  // namespace
}  // namespace ht

int main(int argc, char** argv) {
  ht::Options o;
  CLI::App app{"hybrid_train: train a ConvNet on Fashion-MNIST through the hybrid_train interpreter"};
  app.add_option("--data", o.data_dir, "folder with the Fashion-MNIST idx files")->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", o.batch, "batch size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate (momentum 0.9)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", o.threads, "ATen threads (0: all hardware threads)");
  app.add_option("--seed", o.seed, "seed for initialization, shuffling and dropout")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return ht::run(o);
  } catch (const ht::UserError& e) {
    std::fprintf(stderr, "hybrid_train: error: %s\n", e.what());
    return ht::kUserErrorExitCode;
  }
}
